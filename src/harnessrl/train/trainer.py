"""The trainer: scored groups of episodes in, one optimizer step, new weights out to the policy.

`rl_step(groups)` reads top to bottom: advantages, sequences, micro-batches, loss with gradient
accumulation, optimizer step, weight push, log. `sft_step(episodes)` shares everything after the
sequences, with the negative log-likelihood of the sampled tokens as its loss. The trainer keeps its
own copy of the weights, so the policy keeps sampling while it trains; `push` copies them over and
the policy's version goes up by one. A micro-batch runs each distinct prompt once and the sampled
tails against it (train/batches.py): the same loss and gradient as whole sequences, for a fraction
of the tokens when G episodes share a prompt.

It knows episodes, sequences and losses; it knows nothing about HTTP, harnesses or where rewards
came from.
"""

from __future__ import annotations

import copy
import ctypes
import json
import logging
import math
import random
import time
import warnings
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch

from harnessrl.policy import Policy
from harnessrl.policy.toolformat import name_tokens
from harnessrl.train import losses, precision
from harnessrl.train.advantages import is_degenerate
from harnessrl.train.batches import MicroBatch, micro_batch, micro_batches, prompt_length, tail_logprobs
from harnessrl.train.checkpoint import load_state, save_checkpoint, write_atomic
from harnessrl.train.config import TrainConfig
from harnessrl.train.credit import credited_sequences
from harnessrl.train.loggers import MetricLoggers
from harnessrl.train.sequences import Sequence, episode_sequences
from harnessrl.types import Episode

log = logging.getLogger(__name__)


class Trainer:
    def __init__(
        self,
        model,
        tokenizer,
        config: TrainConfig | None = None,
        run_dir: Path | None = None,
        policy: Policy | None = None,
        loggers: list[str] | None = None,
    ):
        self.config = config = config or TrainConfig()
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        self.tokenizer, self.policy, self.run_dir = tokenizer, policy, run_dir
        # the in-process sampler never draws an embedding row past the tokenizer (policy.sampling): RL scores the same
        # distribution; a vLLM server draws from every row, so then does the trainer
        spare_rows = getattr(getattr(policy, "engine", None), "spare_rows", False)
        self.vocab = len(tokenizer) if tokenizer is not None and not spare_rows else None
        # eval mode throughout: dropout off in every logprob pass (loss and proximal), gradients flow all the same
        self.model = copy.deepcopy(model).eval()
        self._plain = None  # a plain copy to write merged LoRA weights into
        if config.lora is not None:
            import peft

            self._plain = copy.deepcopy(model).eval()
            lora = config.lora
            self.model = peft.get_peft_model(
                self.model,
                peft.LoraConfig(
                    r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules
                ),
            )
            self.model.eval()
        _warn_dropout(model, config)
        self.precision, self.precision_reason = precision.resolve(config.precision)
        log.info("trainer: %s", self.precision_reason)
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if config.kl != "none" else None
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        vocab = model.get_output_embeddings().weight.shape[0]  # large vocabularies get fewer loss tokens a micro-batch
        self.micro_loss_tokens = max(16, config.logit_budget // vocab)
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_factor(config))
        self.step = 0
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
        if loggers and run_dir is None:
            raise ValueError("loggers write beside metrics.jsonl: give the trainer a run_dir")
        self.loggers = MetricLoggers(run_dir, loggers) if loggers else None  # TensorBoard / wandb (train/loggers.py)

    # ---- steps -----------------------------------------------------------------------------

    def rl_step(self, groups: list[list[Episode]], extra: dict[str, float] | None = None) -> dict[str, float]:
        """One policy-gradient update on groups of scored episodes (each group: one task, G episodes)."""
        # advantages
        all_sequences, dropped, failed, small_roles = [], 0, 0, 0
        for group in groups:
            scores = [_reward(e) for e in group]
            if _reward_failed(group):  # a judge failed, a term gave NaN: no score, not a zero
                failed += 1
                continue
            if not self.informative(group):
                dropped += 1
                continue
            credited, small = credited_sequences(
                group, scores, self.config.advantage, self.config.credit, self.config.mask_agents,
                self.config.segments == "share",
            )  # fmt: skip
            all_sequences += credited
            small_roles += small
        # sequences: policy-gradient losses train on sampled tokens (never a greedy reply); an expert's demonstration
        # in a group as `guidance` says. The batch's metrics are the sampled episodes'.
        guides = {e.id for g in groups for e in g if e.demonstrated} if self.config.guidance != "none" else set()
        sequences = []
        for s in all_sequences:
            if s.episode_id not in guides and s.sampled_loss_tokens < s.loss_tokens:  # a greedy reply: no loss
                s = replace(s, loss_mask=[m * x for m, x in zip(s.loss_mask, s.sampled)])
            sequences += [s] if s.loss_tokens else []
        episodes = [e for g in groups for e in g if not e.demonstrated]
        metrics = {
            "rollout/groups": len(groups),
            "rollout/groups_dropped_equal": dropped,
            "rollout/groups_dropped_reward_failed": failed,
            **({"rollout/role_groups_dropped_one_member": small_roles} if self.config.credit == "role" else {}),
            "rollout/episodes": len(episodes),
            "rollout/failed": sum(e.status == "failed" for e in episodes),
            # what the batch achieved: the harness's own verdict, and episodes with a tool call that did not parse
            "rollout/success": _share([e.succeeded for e in episodes]),
            "rollout/malformed_share": _share([any(c.tool_call_error for c in e.calls) for e in episodes]),
            "rollout/sequences": len(sequences),
            "rollout/demonstrations": sum(e.demonstrated for g in groups for e in g),
            "rollout/unsampled_loss_tokens": sum(s.loss_tokens - s.sampled_loss_tokens for s in all_sequences),
            **_reward_metrics(episodes, [_reward(e) for e in episodes]),
            **(extra or {}),
        }
        return self._update(sequences, "rl", metrics)

    def informative(self, group: list[Episode]) -> bool:
        """False for a group the update drops: a judge failed, or dynamic sampling finds it all tied (by
        `filter_groups_by`). The rollout engine refills a batch's dropped groups (`refill_rounds`)."""
        if _reward_failed(group):
            return False
        return not (self.config.dynamic_sampling and is_degenerate(_filter_values(group, self.config.filter_groups_by)))

    def sft_step(self, episodes: list[Episode], extra: dict[str, float] | None = None) -> dict[str, float]:
        """One supervised update: negative log-likelihood of the sampled tokens, same masks as RL."""
        names = partial(name_tokens, self.tokenizer) if self.tokenizer is not None else None
        sequences = [s for e in episodes for s in episode_sequences(e, 1.0, self.config.mask_agents, names=names)]
        return self._update(
            sequences, "sft", {"rollout/episodes": len(episodes), "rollout/sequences": len(sequences), **(extra or {})}
        )

    def _update(
        self, sequences: list[Sequence], objective: Literal["rl", "sft"], metrics: dict[str, float]
    ) -> dict[str, float]:
        cfg, started = self.config, time.perf_counter()
        if not sequences:  # every group dropped, or nothing trainable: no step, but say so
            metrics.update(
                {
                    "step": self.step,
                    "policy_version": self.policy.version if self.policy else -1,
                    "perf/skipped_update": 1,
                }
            )
            self.log(metrics)
            return metrics
        rl = objective == "rl"
        version = self.policy.version if self.policy is not None else -1
        # mini-batches: RL makes `ppo_epochs` passes over the batch, each reshuffled and split in `mini_batches`
        passes, parts = (cfg.ppo_epochs, cfg.mini_batches) if rl else (1, 1)
        rng = random.Random(f"{cfg.seed}:{self.step}")
        plan, groups = [], _by_prompt(sequences) if passes * parts > 1 else [sequences]
        for _ in range(passes):
            order = [s for group in rng.sample(groups, len(groups)) for s in group]
            plan += [
                part for i in range(parts) if (part := order[len(order) * i // parts : len(order) * (i + 1) // parts])
            ]
        # every mini-batch's proximal and reference logprobs come from the weights before this update
        prepared = [self._prepare(part, rl) for part in plan]

        stats, grad_norms = _Stats(), []
        for n, part in enumerate(prepared):  # the train/sample gap and staleness: on the first step, before any change
            grad_norms.append(self._descend(*part, rl=rl, stats=stats, version=version if n == 0 else -1))
        taken = [g for g in grad_norms if not math.isnan(g)]  # NaN: a step skipped, its loss or gradient not finite
        if nonfinite := len(grad_norms) - len(taken):
            metrics["optim/nonfinite_steps"] = nonfinite
        if not taken:  # the weights, the schedule and the policy stay as they were
            metrics.update({"step": self.step, "policy_version": version, "perf/skipped_update": 1})
            self.log(metrics)
            return metrics
        lr = self.optimizer.param_groups[0]["lr"]  # the rate this update trained at (the scheduler then sets the next)
        self.scheduler.step()
        self.step += 1
        new_version = self.push()
        _release_freed_memory()

        # log
        seconds = time.perf_counter() - started
        metrics.update(stats.summary(prefix="loss/sft" if not rl else "loss/policy", steps=len(taken)))
        metrics.update({
            "step": self.step,
            "policy_version": new_version,
            "perf/bf16": int(self.precision == "bf16"),
            "optim/grad_norm": sum(taken) / len(taken),
            "optim/steps": len(taken),
            "optim/lr": lr,
            "perf/step_seconds": seconds,
            "perf/tokens": sum(len(s) for s in sequences),
            "perf/loss_tokens": sum(s.loss_tokens for s in sequences),
            "perf/padded_tokens": sum(mb.padded_tokens for micro, *_ in prepared for mb in micro),
            "perf/tokens_per_s": passes * sum(len(s) for s in sequences) / seconds,
            "perf/micro_batches": sum(len(micro) for micro, *_ in prepared),
        })  # fmt: skip
        self.log(metrics)
        return metrics

    def _prepare(self, sequences: list[Sequence], rl: bool) -> tuple:
        """One optimizer step's micro-batches (prompts shared, train/batches.py), their proximal and
        reference logprobs when the loss needs them, and the step's normalisers."""
        cfg = self.config
        micro = [micro_batch(mb) for mb in micro_batches(sequences, cfg.token_budget, self.micro_loss_tokens)]
        prox = [self._logprobs(self.model, mb) for mb in micro] if rl and cfg.off_policy == "decoupled" else None
        ref = [self._logprobs(self.reference, mb) for mb in micro] if rl and self.reference is not None else None
        num_tokens = sum(s.loss_tokens for s in sequences)  # RL: sampled or demonstrated (rl_step)
        return micro, prox, ref, len(sequences), num_tokens

    def _descend(self, micro, prox, ref, num_sequences: int, num_tokens: int, rl: bool, stats, version: int) -> float:
        """One optimizer step: the loss accumulated over micro-batches with step-wide normalisers; the grad norm,
        NaN when the loss or the gradient was not finite and the step was skipped (its statistics then left out of
        `stats`, so a partly skipped update logs the steps it took)."""
        cfg = self.config
        self.optimizer.zero_grad(set_to_none=True)
        kept, stats = stats, _Stats()
        for i, mb in enumerate(micro):
            bonus = cfg.entropy_coef if rl else 0.0
            with self._autocast():  # RL scores the distribution each token was sampled from; SFT the model's own
                logp, entropy = tail_logprobs(  # (B, T-1)
                    self.model, mb, sampled=rl, with_entropy_grad=bool(bonus), vocab=self.vocab
                )
            mask = mb.mask * mb.sampled if rl else mb.mask
            if not rl:
                per_token, ratio, weight, kl = -logp * (1 + (cfg.name_weight - 1) * mb.names), None, None, None
                stats.track("sft/name_p", logp.detach().exp(), mask * mb.names)
            else:
                anchor = prox[i] if prox is not None else mb.behaviour
                if cfg.loss == "ppo":
                    dual = cfg.is_cap if cfg.off_policy == "behaviour" else None
                    per_token, ratio = losses.ppo_clip_loss(
                        logp, anchor, mb.advantages, cfg.eps_low, cfg.eps_high, dual
                    )
                else:
                    per_token, ratio = losses.cispo_loss(logp, anchor, mb.advantages, cfg.eps_low, cfg.eps_high)
                weight = losses.truncated_is_weight(prox[i], mb.behaviour, cfg.is_cap) if prox is not None else None
                if weight is not None:
                    per_token = per_token * weight
                if cfg.guidance != "none" and (guided := mb.mask * (1 - mb.sampled)).any():  # demonstrated tokens
                    shaped = (
                        losses.policy_shaping_loss(logp, mb.advantages, cfg.guidance_gamma)
                        if cfg.guidance == "shaping"
                        else -mb.advantages * logp
                    )
                    per_token, mask = torch.where(guided > 0, shaped, per_token), mask + guided
                    stats.track("policy/guided_p", logp.detach().exp(), guided)
                kl = None
                if ref is not None:  # importance-weighted when asked: the tokens are the behaviour policy's samples, so
                    # the weight is pi / pi_behaviour; decoupled, pi / pi_prox times the truncated pi_prox / pi_behaviour
                    correction = ratio if weight is None else ratio * weight
                    kl = losses.kl_penalty(logp, ref[i], cfg.kl, correction if cfg.kl_bias_correction else None)
                if kl is not None:
                    per_token = per_token + cfg.kl_coef * kl
                if bonus:
                    per_token = per_token - bonus * entropy
            per_token = per_token * mb.weights  # (B, 1): 1 unless a chain's segments share their episode's weight
            loss = losses.aggregate(
                per_token, mask, cfg.aggregation if rl else "token", num_sequences, num_tokens, cfg.norm_tokens
            )
            loss.backward()
            sampled = mb.mask * mb.sampled if rl else mask  # statistics of sampled tokens: a demonstration has no ratio
            stats.add(loss, logp, entropy.detach(), mb, sampled, ratio, weight, kl, version if rl else -1, cfg)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip or math.inf))
        if not (math.isfinite(stats.loss) and math.isfinite(grad_norm)):  # one NaN would make every weight NaN
            self.optimizer.zero_grad(set_to_none=True)
            return math.nan
        self.optimizer.step()
        kept.merge(stats)
        return grad_norm

    @torch.no_grad()
    def _logprobs(self, model, mb: MicroBatch) -> torch.Tensor:
        """The sampling distribution's logprobs under `model` (the proximal policy or the reference)."""
        with self._autocast():
            return tail_logprobs(model, mb, sampled=True, vocab=self.vocab)[0]

    def _autocast(self):
        return precision.autocast(self.precision)

    # ---- weights, checkpoints, logs ---------------------------------------------------------

    def plain_state(self) -> dict[str, torch.Tensor]:
        """The weights under plain Hugging Face names (LoRA deltas added, the base left untouched)."""
        if self._plain is None:
            return self.model.state_dict()
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        state = {
            k.replace(".base_layer.", "."): v.detach().clone() for k, v in base.state_dict().items() if "lora_" not in k
        }
        with torch.no_grad():
            for name, module in base.named_modules():
                if isinstance(module, LoraLayer):
                    state[f"{name}.weight"] += module.get_delta_weight(module.active_adapters[0])
        return state

    def push(self, at_least: int = 0) -> int:
        """Copy the trained weights into the serving policy; returns its new version (-1 without one)."""
        if self.policy is None:
            return -1
        return self.policy.update_weights(self.plain_state(), at_least)

    def write_model(self, folder: Path) -> None:
        """A Hugging Face folder (safetensors) that transformers and vLLM load as is."""
        if self._plain is None:
            self.model.save_pretrained(folder)
        else:
            self._plain.load_state_dict(self.plain_state())
            self._plain.save_pretrained(folder)
            self.model.save_pretrained(folder / "adapter")
        self.tokenizer.save_pretrained(folder)

    def save(self, root: Path, cursor: dict[str, Any] | None = None, number: int | None = None) -> Path:
        """A checkpoint under `root`, numbered by `number` (the caller's own counter, e.g. RL updates) or the step."""
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "trainable": {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad},
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "cursor": cursor or {},
            "config": self.config.model_dump(),
            "policy_version": self.policy.version if self.policy is not None else -1,
        }
        return save_checkpoint(root, self.step if number is None else number, self.write_model, state)

    def resume(self, path: Path) -> dict[str, Any]:
        """Restore weights, optimizer, schedule, step and RNG from a checkpoint; returns its data cursor."""
        state = load_state(path)
        saved, lora = state.get("config", {}).get("lora"), self.config.lora
        if _adapter_shape(saved) != _adapter_shape(lora and lora.model_dump()):  # the trained weights would not fit
            raise ValueError(f"{path}: the checkpoint trained lora {saved}, this config asks lora {lora}: resume "
                             "with the config it was trained with, or start a new run")  # fmt: skip
        named = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state["trainable"].items():
                named[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._configured_hyperparameters(state.get("config", {}))
        self.step = state["step"]
        self.forget_after(self.step)
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.push(at_least=state.get("policy_version", 0))  # versions go on from the saved one, never back
        return state["cursor"]

    def _configured_hyperparameters(self, saved: dict[str, Any]) -> None:
        """After loading a checkpoint's optimizer and schedule: this config's learning rate, schedule, betas and weight
        decay, not the checkpoint's (a resume may change them; each change is logged)."""
        cfg = self.config
        now = cfg.model_dump() | {"total_steps": _total_steps(cfg.total_steps)}
        saved = saved | {"total_steps": _total_steps(saved.get("total_steps"))}
        for key in ("lr", "schedule", "warmup_steps", "total_steps", "betas", "weight_decay"):
            if key in saved and saved[key] != now[key]:
                log.warning("resume: %s %s -> %s (this config's)", key, saved[key], now[key])
        self.scheduler.base_lrs = [cfg.lr] * len(self.optimizer.param_groups)
        factor = _lr_factor(cfg)(self.scheduler.last_epoch)
        for group in self.optimizer.param_groups:
            group.update(initial_lr=cfg.lr, lr=cfg.lr * factor, betas=cfg.betas, weight_decay=cfg.weight_decay)

    def reschedule(self, total_steps: int) -> None:
        """Another length for the learning-rate schedule, from the next step on, as if it had been the length from the
        start (the steps already made keep the rates they trained at): the main job's SFT fitted to its time budget."""
        self.config = self.config.model_copy(update={"total_steps": total_steps})
        self.scheduler.lr_lambdas = [_lr_factor(self.config)] * len(self.optimizer.param_groups)
        self._configured_hyperparameters(self.config.model_dump())  # the current rate from the new schedule

    def forget_after(self, step: int, lines: int | None = None) -> None:
        """Drop metrics.jsonl lines past `step` (and a line cut short), and past the first `lines` of them where
        given: a run that stopped after its last checkpoint redoes those steps, and each step is logged once. RL
        logs a line an update, and a skipped update's (every group tied) keeps the step before it, so a job resuming
        at update N keeps N lines: the step alone kept a skipped update after the checkpoint, then logged it again."""
        path = self.run_dir / "metrics.jsonl" if self.run_dir is not None else None
        if path is None or not path.is_file():
            return
        kept = []
        for line in path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step and (lines is None or len(kept) < lines):
                    kept.append(line + "\n")
            except json.JSONDecodeError:
                pass
        if kept:
            write_atomic(path, "".join(kept))  # a kill or full disk here must not cost the run its history
        else:  # nothing logged yet: no file, as before the first step (an empty one reads as a broken log)
            path.unlink()

    def log(self, metrics: dict[str, Any]) -> None:
        if self.run_dir is not None:
            with open(self.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(metrics) + "\n")
        if self.loggers is not None:
            self.loggers.write(metrics)


def clipped(ratio: torch.Tensor, advantages: torch.Tensor, cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the clip bites, below and above: PPO's where it takes the token's gradient away (the ratio past a bound
    in its advantage's direction); CISPO's wherever it clips the importance weight, whatever the advantage."""
    low, high = ratio < 1 - cfg.eps_low, ratio > 1 + cfg.eps_high
    if cfg.loss == "ppo":
        low, high = low & (advantages < 0), high & (advantages > 0)
    return low, high


class _Stats:
    """Sums over loss tokens across micro-batches, reported once per update."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.mins: dict[str, float] = {}
        self.maxs: dict[str, float] = {}
        self.loss = 0.0

    def track(self, key: str, values: torch.Tensor, mask: torch.Tensor) -> None:
        picked = values.detach()[mask.bool()]
        self.sums[key] = self.sums.get(key, 0.0) + float(picked.sum())
        self.sums[key + "#n"] = self.sums.get(key + "#n", 0.0) + picked.numel()
        if picked.numel():
            self.mins[key] = min(self.mins.get(key, math.inf), float(picked.min()))
            self.maxs[key] = max(self.maxs.get(key, -math.inf), float(picked.max()))

    def merge(self, other: _Stats) -> None:
        """Take in another's sums (one optimizer step's)."""
        self.loss += other.loss
        for key, value in other.sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        for key, value in other.mins.items():
            self.mins[key] = min(self.mins.get(key, math.inf), value)
        for key, value in other.maxs.items():
            self.maxs[key] = max(self.maxs.get(key, -math.inf), value)

    def add(self, loss, logp, entropy, mb, mask, ratio, weight, kl, version, cfg) -> None:
        self.loss += float(loss.detach())
        self.track("policy/entropy", entropy, mask)
        if version >= 0:  # train/sample gap on tokens the current weights sampled
            same = mask * (mb.versions == version)
            self.track("policy/logprob_gap", (logp.detach() - mb.behaviour).abs(), same)
            self.track("policy/staleness", (version - mb.versions).float(), mask)
        if ratio is not None:
            self.track("policy/ratio", ratio, mask)
            low, high = clipped(ratio, mb.advantages, cfg)
            self.track("policy/clip_frac_low", low.float(), mask)
            self.track("policy/clip_frac_high", high.float(), mask)
        if weight is not None:
            self.track("policy/is_weight", weight, mask)
            self.track("policy/is_weight_capped", (weight >= (cfg.is_cap or math.inf)).float(), mask)
        if kl is not None:
            self.track("policy/kl", kl, mask)

    def summary(self, prefix: str, steps: int = 1) -> dict[str, float]:
        """Means over loss tokens (the loss: per optimizer step); the ratio and IS weight also get their min and max."""
        out = {prefix: self.loss / steps}
        for key, total in self.sums.items():
            count = self.sums.get(key + "#n", 0)
            if key.endswith("#n") or not count:
                continue
            if key in ("policy/ratio", "policy/is_weight"):
                out.update({key + "_mean": total / count, key + "_min": self.mins[key], key + "_max": self.maxs[key]})
            else:
                out[key] = total / count
        return out


def _by_prompt(sequences: list[Sequence]) -> list[list[Sequence]]:
    """The sequences bundled by prompt (a group's samples). RL's passes shuffle whole bundles, so a
    group cut into mini-batches stays whole (but where a cut falls): the forward runs its prompt once
    and its advantages, zero-mean within the group, stay balanced within each optimizer step."""
    bundles: dict[tuple[int, ...], list[Sequence]] = {}
    for s in sequences:
        bundles.setdefault(tuple(s.ids[: prompt_length(s)]), []).append(s)
    return list(bundles.values())


def _release_freed_memory() -> None:
    """Hand memory freed by this update back to the OS (glibc only). Updates run in worker threads
    (`asyncio.to_thread`), each with its own malloc arena that keeps what it freed: on SmolLM2 the
    weather example grew to 24 GB in 4 updates, 11 GB with MALLOC_ARENA_MAX=2."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
        pass


def _warn_dropout(model, config: TrainConfig) -> None:
    """Dropout would make the logprobs the loss sees differ from the sampler's; the trainer runs with it off."""
    rates = {k: v for k, v in model.config.to_dict().items() if "dropout" in k and isinstance(v, float) and v > 0}
    if config.lora is not None and config.lora.dropout > 0:
        rates["lora.dropout"] = config.lora.dropout
    if rates:
        warnings.warn(
            f"dropout is off while training ({rates} ignored): logprobs must be scored as sampled", stacklevel=3
        )


def _reward(episode: Episode) -> float:
    if episode.reward is None:
        raise ValueError(f"episode {episode.id} has no reward: score it before training")
    return episode.reward.total


def _reward_failed(group: list[Episode]) -> bool:
    """A term failed, or a total is NaN or inf (a breakdown not built by `Reward`): one would make every advantage of
    the group NaN, and whether the group looks tied would depend on the episodes' order."""
    return any(not math.isfinite(_reward(e)) or e.reward.failure for e in group)


def _filter_values(group: list[Episode], by: str) -> list[float]:
    """What dynamic sampling compares within a group: the rewards, or the outcomes (1 success, 0 not). A group
    with an episode that has no verdict (a harness that reports none) falls back to its rewards."""
    if by == "outcome" and all(e.outcome is not None and e.outcome.success is not None for e in group):
        return [float(e.outcome.success) for e in group]
    return [_reward(e) for e in group]


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def _reward_metrics(episodes: list[Episode], rewards: list[float]) -> dict[str, float]:
    if not rewards:
        return {}
    r = torch.tensor(rewards)
    out = {"reward/mean": float(r.mean()), "reward/std": float(r.std(unbiased=False)), "reward/max": float(r.max())}
    for field, prefix in (("terms", "reward/"), ("values", "term/")):  # weighted, and before weighting
        terms: dict[str, list[float]] = {}
        for e in episodes:
            for name, value in getattr(e.reward, field).items():
                terms.setdefault(name, []).append(value)
        out.update({f"{prefix}{name}": sum(v) / len(v) for name, v in terms.items()})
    flags = {flag for e in episodes for flag in e.reward.flags}
    out.update({f"hacking/{flag}": sum(flag in e.reward.flags for e in episodes) / len(episodes) for flag in flags})
    return out


WSD_DECAY = 0.2  # schedule "wsd" (MiniCPM's warmup-stable-decay): the share of the steps after warm-up that decay


def _adapter_shape(lora: dict | None) -> tuple | None:
    """What a LoRA checkpoint's trained weights follow (rank, modules); alpha and dropout may change on resume."""
    return lora and (lora["r"], sorted(lora["target_modules"]))


def _total_steps(total: int | None) -> int:
    return total or 1000  # TrainConfig.total_steps None: a Trainer that does not know its length


def _lr_factor(cfg: TrainConfig):
    total = _total_steps(cfg.total_steps)

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
        if cfg.schedule == "linear":
            return 1.0 - progress
        if cfg.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if cfg.schedule == "wsd":  # warm-up, stable, then a linear decay over the last WSD_DECAY of the steps
            return min(1.0, (1.0 - progress) / WSD_DECAY)
        return 1.0

    return factor
