"""Trainer configuration, validated once; every field has a default that runs on the embedded setup."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harnessrl.train.advantages import AdvantageKind
from harnessrl.train.losses import Aggregation
from harnessrl.train.precision import Precision


class LoraConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    r: int = Field(default=16, ge=1, description="adapter rank")
    alpha: int = Field(default=32, ge=1, description="scaling numerator (scale = alpha / r)")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="module names that get adapters",
    )


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # lr inf skipped every step after the first

    # advantages
    advantage: AdvantageKind = Field(
        default="grpo", description="grpo (mean/std), drgrpo (mean only), rloo (leave-one-out)"
    )
    dynamic_sampling: bool = Field(default=True, description="drop groups that are all equal (counted)")
    filter_groups_by: Literal["reward", "outcome"] = Field(
        default="reward",
        description="what dynamic sampling compares: reward (the total), or outcome (the harness's success: a "
        "group that all failed is dropped even where penalties differ; verl's DAPO filter_groups.metric: acc)",
    )
    credit: Literal["episode", "role"] = Field(
        default="episode",
        description="episode: one advantage per episode; role: each agent role (trainable sub-agents) grouped "
        "and baselined on its own within the task (train/credit.py)",
    )
    segments: Literal["each", "share"] = Field(
        default="each",
        description="each: every sequence of an episode weighs 1; share: a chain's segments (cut by summaries or "
        "prunes) weigh 1 / their number, so each episode weighs 1 (self-summarisation, docs/code.md)",
    )
    mask_agents: list[str] = Field(
        default_factory=list, description="agents whose completions carry no loss, e.g. [summariser] (an ablation)"
    )
    # loss
    loss: Literal["ppo", "cispo"] = Field(default="ppo", description="PPO/GRPO clipped surrogate, or CISPO")
    eps_low: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="lower clip: ratio >= 1 - eps_low; default 0.2 (ppo), 1.0 (cispo: no lower clip)",
    )
    eps_high: float = Field(default=0.28, ge=0, description="upper clip: ratio <= 1 + eps_high (DAPO clip-higher)")
    aggregation: Aggregation = Field(default="token", description="token (DAPO), sequence (GRPO), constant (Dr.GRPO)")
    norm_tokens: int = Field(default=1024, ge=1, description="the constant aggregation's tokens per sequence")
    off_policy: Literal["behaviour", "decoupled"] = Field(
        default="behaviour", description="ratio against the sampled logprobs, or against the proximal policy"
    )
    is_cap: float | None = Field(
        default=3.0, gt=1, description="behaviour: dual-clip bound for A < 0; decoupled: truncated IS weight cap"
    )
    kl: Literal["none", "k1", "k3"] = Field(default="none", description="KL-to-reference estimator")
    kl_coef: float = Field(default=0.0, ge=0, description="weight of the KL term")
    kl_bias_correction: bool = Field(
        default=False,
        description="multiply the per-token KL by the importance ratio pi / pi_behaviour (decoupled: pi / pi_prox x the "
        "truncated IS weight); needs kl (DeepSeek-V3.2; TRL's use_bias_correction_kl)",
    )
    entropy_coef: float = Field(
        default=0.0,
        description="loss -= entropy_coef x the sampling distribution's entropy on loss tokens (verl entropy_coeff): "
        "> 0 keeps exploring, < 0 sharpens the policy (entropy minimisation), 0 = off",
    )
    guidance: Literal["none", "shaping", "nll"] = Field(
        default="shaping",
        description="how loss tokens that were not sampled (an expert's demonstration in an RL group: off-policy "
        "guidance) train: shaping = LUFFY's policy shaping -A p / (p + guidance_gamma), p the token's probability "
        "now; nll = -A log p, as if the policy had sampled it; none = not at all",
    )
    guidance_gamma: float = Field(default=0.1, gt=0, description="shaping's gamma")
    name_weight: float = Field(
        default=1.0,
        ge=0,
        description="SFT: each token that writes a called tool's name (`toolformat.name_tokens`: where an agent "
        "picks its next action; a handful among many copied tokens) counts this many times in the loss, still "
        "divided by the plain count of loss tokens; 1 = plain NLL",
    )
    # optimisation
    ppo_epochs: int = Field(
        default=1, ge=1, description="optimizer passes over each RL batch (verl ppo_epochs, TRL num_iterations)"
    )
    mini_batches: int = Field(
        default=1, ge=1, description="optimizer steps per pass, each on a share of the batch (verl ppo_mini_batch_size)"
    )
    lr: float = Field(default=1e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        default=(0.9, 0.999), description="AdamW's (beta1, beta2), each in [0, 1)"
    )
    grad_clip: float | None = Field(default=1.0, gt=0, description="max global grad norm; None disables")
    schedule: Literal["constant", "linear", "cosine", "wsd"] = Field(
        default="constant",
        description="after the warm-up: constant; linear or cosine decay to 0 at total_steps; wsd holds lr and decays "
        "linearly to 0 over the last 20 %",
    )
    warmup_steps: int = Field(default=0, ge=0)
    total_steps: int | None = Field(
        default=None,
        ge=1,
        description="steps over which linear / cosine / wsd decay to 0 (None: 1000; the jobs set SFT's to sft.steps, "
        "or to the steps their time budget planned, and a decaying RL schedule's to rl.updates)",
    )
    token_budget: int = Field(
        default=8192, ge=16, description="padded tokens per micro-batch (grad accumulation above it)"
    )
    logit_budget: int = Field(
        default=2**27,
        ge=2**16,
        description="most logits (loss tokens x vocabulary) a micro-batch holds, since only loss positions are "
        "projected onto the vocabulary: a 49k-vocabulary model gets 2,730 loss tokens (each fp32 copy of "
        "2,730 x 49k logits is 0.54 GB, and the loss makes several); a longer sequence gets a micro-batch alone",
    )
    lora: LoraConfig | None = Field(default=None, description="train LoRA adapters instead of all weights")
    precision: Precision = Field(
        default="fp32",
        description="fp32, bf16 autocast, or auto: bf16 where the CPU has it natively (AVX-512 BF16 / AMX), else fp32",
    )
    seed: int = 0

    @model_validator(mode="after")
    def _defaults_by_loss(self) -> TrainConfig:
        if self.eps_low is None:
            self.eps_low = 1.0 if self.loss == "cispo" else 0.2
        return self

    @model_validator(mode="before")
    @classmethod
    def _bf16_renamed(cls, data):
        if isinstance(data, dict) and "bf16" in data:
            raise ValueError("bf16 is now precision: auto (bf16 where the CPU has it natively), bf16 or fp32")
        return data

    @model_validator(mode="after")
    def _warmup_within_total(self) -> TrainConfig:
        if self.schedule != "constant" and self.total_steps is not None and self.warmup_steps >= self.total_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be below total_steps ({self.total_steps}) with schedule "
                f"{self.schedule}: the rate would never reach its peak nor decay"
            )
        return self

    @model_validator(mode="after")
    def _kl_needs_both(self) -> TrainConfig:
        if (self.kl == "none") != (self.kl_coef == 0):
            raise ValueError("kl and kl_coef go together: set both (e.g. kl: k3, kl_coef: 0.01) or neither")
        if self.kl_bias_correction and self.kl == "none":  # it weights a KL term: without one it would do nothing
            raise ValueError("kl_bias_correction weights the KL term, but kl: none: set kl and kl_coef, or drop it")
        return self


LORA_ABOVE = 50_000_000  # parameters: above this, `lora: auto` trains adapters instead of all weights


def lora_for(model, wanted: bool | str = "auto", config: LoraConfig | None = None) -> LoraConfig | None:
    """The adapters to train (`config`, or the defaults) or None for all weights; `auto`: adapters when
    `config` names them, or for models over LORA_ABOVE parameters (a 135M model's AdamW state alone is
    1 GB in fp32)."""
    if wanted == "auto":
        wanted = config is not None or sum(p.numel() for p in model.parameters()) > LORA_ABOVE
    return (config or LoraConfig()) if wanted else None
