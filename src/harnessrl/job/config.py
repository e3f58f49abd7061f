"""The main job's configuration (YAML), validated once: an unknown key or bad value names itself."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harnessrl.envs.search.data import Doc, SearchTask, load, synthetic
from harnessrl.envs.search.reward import DemoFilter, SearchReward
from harnessrl.harness.swarm import SwarmLimits
from harnessrl.policy.sources import SHIPPED
from harnessrl.policy.toolformat import ToolFormatName
from harnessrl.rewards import Schedule, anneal_to_zero
from harnessrl.rollout import RolloutConfig
from harnessrl.train import TrainConfig
from harnessrl.train.loggers import Loggers
from harnessrl.train.precision import Precision
from harnessrl.types import read_yaml, validated

# `budget_seconds: auto` for the embedded default: the main job in 15 minutes on a 2-core CPU, whatever its CPU (the
# default's 24 updates took 872-1017 s on an AMX Xeon and 1175 s under the AVX2 settings, 2026-12-05)
LAPTOP_SECONDS = 900.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # .nan / .inf in YAML: refused at load


class DataConfig(_Strict):
    corpus: Path | None = Field(default=None, description="corpus.jsonl; empty = the synthetic generator")
    tasks: Path | None = Field(default=None, description="tasks.jsonl (split train / test)")
    synthetic_seed: int = 0
    # 340 since 2026-12-05 (240 before): 240 demonstrated tasks instead of 180 make a better warm start (same held-out
    # questions, seed 0). RL's gain over ten runs of it: +0.087 mean, five intervals of ten above 0 (seeds 0-2 that
    # evening +0.185, rerun that night +0.046; docs/search-history.md, "The default since 2026-12-05, evening" and the
    # rerun below it)
    synthetic_people: int = Field(
        default=340, ge=8, description="people in the synthetic corpus, one question each (a quarter held out)"
    )

    @model_validator(mode="after")
    def _both_or_neither(self) -> DataConfig:
        if (self.corpus is None) != (self.tasks is None):
            raise ValueError("data.corpus and data.tasks go together (neither: the synthetic generator)")
        return self

    def documents(self) -> tuple[list[Doc], list[SearchTask]]:
        """The corpus and its tasks: the files, or the synthetic generator's (an error names the key)."""
        if self.corpus is not None:
            return load(self.corpus, self.tasks)
        try:
            return synthetic(self.synthetic_seed, people=self.synthetic_people)
        except ValueError as exc:  # more people than the generator has names
            raise ValueError(f"data.synthetic_people: {exc}") from None


class AgentConfig(_Strict):
    context_budget: int = Field(default=1024, ge=256, description="tokens; past half the agent is told to prune")
    max_turns: int = Field(default=6, ge=1)
    k: int = Field(default=3, ge=1, description="chunks per search")
    max_tokens: int = Field(default=96, ge=8, description="per model turn")


class SFTConfig(_Strict):
    # 230 steps of 8 (since 2026-12-05; before: 120, and 50 of 16 before 2026-12-04): the warm start is better and RL
    # gains more from it (mean +0.171 against +0.076 over three seeds on one machine; docs/search-history.md, "The
    # default since 2026-12-05"), for ~170 s more SFT
    steps: int = Field(default=230, ge=0, description="0 skips the warm start; fewer where budget_share ends it")
    batch_episodes: int = Field(default=8, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    schedule: Literal["constant", "linear", "cosine", "wsd"] = Field(
        default="cosine",
        description="the learning rate over `steps` after a warm-up of min(5, steps / 10): cosine and linear decay to 0 "
        "at the last step; constant keeps `lr`; wsd keeps it, then decays linearly over the last 20 % "
        "(docs/training.md, 'Where the agent decides')",
    )
    name_weight: float = Field(
        default=1.0, ge=0, description="loss weight of the tokens naming each call's tool (TrainConfig.name_weight)"
    )
    demos_per_task: int = Field(default=1, ge=1)
    filter: DemoFilter | None = Field(
        default=None, description="keep demonstrations by trajectory / output recall (Context-1); none keeps all"
    )
    save_every: int = Field(default=20, ge=1, description="checkpoint every N steps (and at the end)")
    precision: Precision = Field(
        default="auto", description="auto: bf16 autocast where the CPU has it natively, else fp32"
    )
    # 0.6: on a Zen 4 in bf16 the 230 steps end at 0.56-0.73 of 900 s (2026-12-05/06); on a Zen 3 (AVX2, fp32) they
    # took 924 s, past the whole budget, and RL made no update (2026-12-07, docs/search-history.md)
    budget_share: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description="with budget_seconds: SFT's schedule ends by this share of the budget (the job's seconds from its "
        "start); its length is planned once, 10 steps after the warm-up, from the steps' pace so far (sft/plan.json), "
        "so a slower CPU trains fewer than `steps` and leaves RL its time",
    )


class RLConfig(_Strict):
    updates: int = Field(default=24, ge=0)
    save_every: int = Field(default=5, ge=1, description="checkpoint every N updates (and at the end)")
    validation_tasks: int = Field(
        default=16,
        ge=0,
        description="train-split tasks set aside (no SFT, no RL) to choose the checkpoint, each hop count (gold "
        "documents a task needs) keeping its share of the split; 0 = keep the last",
    )
    fresh_tasks: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="share of the train tasks (after validation's, each hop count keeping its share) set aside for RL "
        "alone, never demonstrated: RL practises on tasks SFT did not memorise (the search job; the swarm's is "
        "swarm.rl_questions); 0 = RL on the demonstrated tasks",
    )
    validation_repeats: int = Field(default=2, ge=1, description="sampled (T = 1) episodes per validation task")
    # 0.2 since 2026-12-06: replayed on 46 finished runs of the search job it cut the runs with a held-out alarm from 23
    # to 7 and the mean greedy change from -0.034 to +0.004, for a mean sampled gain of +0.056 instead of +0.075
    # (benchmarks/validation_rule.py; docs/search-history.md, "Validation's rule")
    validation_p: float = Field(
        default=0.2,
        gt=0,
        le=1,
        description="an update replaces the warm start only where its validation beats update 0's with a one-sided "
        "permutation p (paired by task) at most this; among those, the best (the later on a tie). 1.0: "
        "whichever update validates best, however little it beats the warm start by (the rule until 2026-12-06)",
    )
    validate_every: int = Field(
        default=8, ge=1, description="validate every N updates (and before the first, and at the end)"
    )
    guidance: bool = Field(
        default=False,
        description="each RL group gets the expert's demonstration of its task beside its sampled episodes (LUFFY's "
        "off-policy guidance; trained as rl.train.guidance says)",
    )
    # staleness 0: on 2 CPU cores, rollouts and updates compete for the same cores (benchmarks/async_vs_sync.py);
    # 8 tasks an update: with 4, groups that all scored alike left an update's gradient to 1-3 tasks, and such
    # updates lost held-out success (docs/search-history.md, "Eight tasks an update, whole")
    rollout: RolloutConfig = Field(
        default_factory=lambda: RolloutConfig(group_size=8, groups_per_update=8, staleness=0)
    )
    # two passes of two mini-batches over each batch (Context-1 used 4 sub-steps a step): one step a batch barely moved the policy;
    # entropy_coef -0.1 sharpens the policy: a T = 1 sample of tiny-base after SFT draws 7-11 tokens at p < 1 % per 1,000,
    # and such an episode rarely succeeds (docs/search-history.md, "What limits the gain")
    train: TrainConfig = Field(
        default_factory=lambda: TrainConfig(
            lr=1e-4, schedule="constant", precision="auto", ppo_epochs=2, mini_batches=2, entropy_coef=-0.1
        )
    )


class SwarmJobConfig(_Strict):
    """The swarm job (job/swarm.py): a trainable orchestrator over frozen search sub-agents on wide tasks."""

    subagent_model: str | None = Field(
        default=None, description="the frozen sub-agent's model (any --model); default: subagent_run's best/"
    )
    subagent_run: Path = Field(
        default=Path("runs/main"),
        description="a search main job's run folder whose best/ is the frozen sub-agent; trained there first if absent",
    )
    subagent_config: Path | None = Field(
        default=None,
        description="the main job config that trains the sub-agent when best/ is absent; default: the embedded "
        "default with this job's model, seed, data and agent",
    )
    subagent_base: str | None = Field(
        default=None,
        description="the model the sub-agent's main job starts from when it is trained here (no subagent_config); "
        "default: this job's model (the orchestrator's base)",
    )
    subagent_temperature: float = Field(
        default=0.0, ge=0, le=2, description="the sub-agents' sampling; 0 = greedy (the gateway's bounds, 0-2)"
    )
    subagent_cache: int = Field(
        default=4096,
        ge=0,
        description="greedy sub-agent completions kept by prompt: a repeat (the episodes of a group, the phases "
        "that run the same questions) is answered from the one generation; 0 generates every call",
    )
    width: int = Field(default=8, ge=2, description="questions per wide task")
    assign: Literal["batch", "each"] = Field(
        default="batch",
        description="how the orchestrator (and its expert) hands out the questions: one assign_tasks call whose "
        "one observation holds the outputs keyed by position (the answer copies one object), or one assign_task "
        "call each, all in one reply (the answer gathers one observation per question)",
    )
    bundlings: int = Field(
        default=4, ge=1, description="times each train question is bundled into a wide task, drawn anew each time"
    )
    rl_questions: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="share of the train questions (after validation's) never demonstrated: RL's tasks are bundled "
        "from them alone, so RL practises on questions SFT did not memorise; 0: RL on the demonstrated tasks",
    )
    limits: SwarmLimits = Field(
        default_factory=lambda: SwarmLimits(
            max_orchestrator_steps=4, max_parallel=16, max_assignments=32, max_critical_steps=8
        ),
        description="swarm limits; a sub-agent (the search agent) also stops at agent.max_turns. The budget of 8 "
        "critical steps is one round of delegation (1 + agent.max_turns 6 + the answer): handing the questions "
        "out over several replies runs out of it (Kimi's critical-step constraint)",
    )
    lambda_parallel: Schedule = Field(
        default_factory=lambda: anneal_to_zero(0.1, 8), description="PARL r_parallel weight"
    )
    lambda_finish: Schedule = Field(default_factory=lambda: anneal_to_zero(0.1, 8), description="PARL r_finish weight")
    orchestrator_max_tokens: int = Field(
        default=1024, ge=16, description="per orchestrator reply; at least the scripted orchestrator's longest"
    )
    orchestrator_temperature: float = Field(
        default=1.0,
        gt=0,
        le=2,  # the gateway refuses more: every episode would fail
        description="the orchestrator's sampling in RL, validation and the sampled held-out evals (the greedy ones: 0)",
    )

    @model_validator(mode="after")
    def _width_fits(self) -> SwarmJobConfig:
        # every question is a run; `batch` hands them out in one assign_tasks call, which takes max_parallel at most
        # (with `each`, runs past max_parallel wait for a slot)
        if self.width > self.limits.max_assignments:
            raise ValueError(
                f"width {self.width}: over limits.max_assignments ({self.limits.max_assignments}), the runs an "
                "episode may start"
            )
        if self.assign == "batch" and self.width > self.limits.max_parallel:
            raise ValueError(
                f"width {self.width}: over limits.max_parallel ({self.limits.max_parallel}); with assign: batch the "
                "questions go out in one assign_tasks call"
            )
        return self

    def episode_seconds(self, replies: float) -> float:
        """An episode's timeout: `replies` seconds for the orchestrator's own generation (rl.rollout.episode_timeout,
        what any agent's episode gets), and each step's tool calls at their longest (`limits.tool_seconds()`), so a
        slow sub-agent times out (an observation) before its episode does (a failure)."""
        return replies + self.limits.max_orchestrator_steps * self.limits.tool_seconds()


class CodeJobConfig(_Strict):
    """The coding job (job/code.py): the coding agent on bug-fix tasks judged by hidden tests."""

    tasks: Path | None = Field(
        default=None,
        description="a folder of task folders (docs/code.md); empty = generated from the curated library, cached",
    )
    per_function: int = Field(default=8, ge=1, description="generated single-site mutants drawn per function")
    pairs: int = Field(default=1, ge=0, description="generated two-site mutants per function")
    impossible_share: float = Field(
        default=0.05, ge=0, le=0.5, description="tasks whose hidden tests contradict the issue"
    )
    max_turns: int = Field(default=8, ge=2, description="agent turns per episode")
    max_tokens: int = Field(default=192, ge=16, description="per model turn")
    summarise_at: int | None = Field(
        default=None, ge=256, description="context tokens at which the agent summarises itself and restarts"
    )
    summary_tokens: int = Field(default=96, ge=16, description="the summary's length budget")
    test_seconds: float = Field(default=30.0, gt=0, description="wall-clock limit of one test run (sandbox)")
    unsandboxed: bool = Field(
        default=False,
        description="train where the sandbox cannot keep the agent's code from the task folders (no bubblewrap: "
        "its `writes` or `reads` guard is off), so a reward can be forged; refused otherwise",
    )


class JobConfig(_Strict):
    model: str = Field(
        default="tiny-base",
        description="'tiny-base', 'tiny', a preset ('smollm2-135m-instruct'), a local Hugging Face folder or a .gguf file",
    )
    tool_format: ToolFormatName = Field(
        default="auto", description="auto (from the chat template) | hermes | llama3_json"
    )
    lora: Literal["auto"] | bool = Field(
        default="auto",
        description="train LoRA adapters (rl.train.lora's settings) in SFT and RL; auto: when rl.train.lora is set or the model has over 50M parameters",
    )
    seed: int = Field(
        default=0,
        description="the job's randomness: the tiny model's init, validation split, demonstrations, SFT and RL batch "
        "order, the trainers' seed (rl.train.seed follows it; another value there is refused) and the sampling streams",
    )
    data: DataConfig = Field(default_factory=DataConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    rl: RLConfig = Field(default_factory=RLConfig)
    reward: SearchReward = Field(
        default_factory=SearchReward,
        description="the search job's reward weights (Context-1's terms; the outcome's by default)",
    )
    prefix_cache: int = Field(
        default=32768,
        ge=0,
        description="tokens of finished replies' KV cache the embedded engine keeps, so an agent's next turn is "
        "prefilled from where its last one ended (0 = off; engine.py)",
    )
    eval_tasks: int | None = Field(default=None, ge=1, description="cap on held-out tasks (None = all)")
    budget_seconds: Annotated[float, Field(gt=0)] | Literal["auto"] | None = Field(
        default="auto",
        description="the job's wall-clock budget: RL ends before rl.updates when one more update (as slow as the "
        "slowest so far), a validation and the eval after (as this run measured them) would take the job past it, and "
        "SFT trains fewer than sft.steps where they would pass sft.budget_share of it. auto: 900 (15 minutes on a "
        "2-core laptop) for the embedded default (an embedded model, tiny-base, tiny-base-long or tiny, on the "
        "synthetic corpus), none for a real model or your own corpus; null: rl.updates always, and sft.steps in a run of "
        "its own (a --warm-start copy keeps its source's SFT)",
    )
    eval_repeats: int = Field(
        default=2, ge=1, description="sampled (T = 1) episodes per held-out task; greedy runs once"
    )
    swarm: SwarmJobConfig | None = Field(
        default=None, description="set: run the swarm job (orchestrator RL over frozen search sub-agents) instead"
    )
    code: CodeJobConfig | None = Field(
        default=None, description="set: run the coding job (bug fixes judged by hidden tests, docs/code.md) instead"
    )
    loggers: Loggers = Field(
        default_factory=list,
        description="also log metrics to tensorboard (RUN/tensorboard) and/or wandb (offline, RUN/wandb)",
    )

    def budget(self) -> float | None:
        """budget_seconds resolved: `auto` is LAPTOP_SECONDS for an embedded model on the synthetic corpus (the
        default job's promise), none for a real model or a corpus of one's own (whose SFT alone may take longer)."""
        if self.budget_seconds != "auto":
            return self.budget_seconds
        return LAPTOP_SECONDS if self.model in ("tiny", *SHIPPED) and self.data.corpus is None else None

    @model_validator(mode="before")
    @classmethod
    def _job_defaults(cls, data):
        """A `swarm:` or `code:` mapping (None by default) over that job's own defaults, key by key, however the
        config is built: `swarm: {limits: {subagent_timeout: 60}}` keeps the swarm job's other limits."""
        if isinstance(data, dict):
            for key, job in (("swarm", SwarmJobConfig), ("code", CodeJobConfig)):
                if isinstance(data.get(key), dict):
                    data = {**data, key: _over(job().model_dump(), data[key])}
        return data

    @model_validator(mode="after")
    def _one_seed(self) -> JobConfig:
        if self.rl.train.seed not in (0, self.seed):  # 0: TrainConfig's default, as older config.yaml files hold it
            raise ValueError(f"rl.train.seed {self.rl.train.seed}: the job's `seed` ({self.seed}) seeds its trainers")
        self.rl.train.seed = self.seed
        return self

    @model_validator(mode="after")
    def _rl_decays_over_its_updates(self) -> JobConfig:
        """RL's schedule steps once an update: a decaying one (rl.train.schedule linear, cosine, wsd) ends at
        rl.updates unless rl.train.total_steps says otherwise (TrainConfig's 1000 would barely decay)."""
        train = self.rl.train
        if train.schedule != "constant" and train.total_steps is None:
            train.total_steps = self.rl.updates
            if train.warmup_steps >= train.total_steps:
                raise ValueError(
                    f"rl.train.warmup_steps ({train.warmup_steps}) must be below rl.updates ({self.rl.updates}) with "
                    f"rl.train.schedule {train.schedule}: the rate would never reach its peak nor decay"
                )
        return self

    @model_validator(mode="after")
    def _one_job(self) -> JobConfig:
        if self.swarm is not None and self.code is not None:
            raise ValueError("swarm and code: a config runs one job; set one of them")
        if self.rl.fresh_tasks and (self.swarm is not None or self.code is not None):
            raise ValueError("rl.fresh_tasks is the search job's (the swarm job's is swarm.rl_questions)")
        if self.rl.fresh_tasks and self.rl.guidance:
            raise ValueError("rl.fresh_tasks with rl.guidance: RL's tasks would have no demonstration to guide them")
        if self.rl.guidance and (self.swarm is not None or self.code is not None):
            raise ValueError("rl.guidance is the search job's: the swarm and code jobs train no guides beside RL")
        if self.sft.filter is not None and self.swarm is not None:
            raise ValueError("sft.filter is the search job's (its recall filter reads one task's gold documents)")
        if self.swarm is not None and self.swarm.limits.max_orchestrator_steps < 2:
            raise ValueError(
                "swarm.limits.max_orchestrator_steps: at least 2 (one reply to assign, one to answer): the expert "
                "demonstrates both, and an orchestrator cut off after one would never answer"
            )
        if self.rl.rollout.backend != "local":  # refused now, not after SFT and the first eval
            raise ValueError(
                "rl.rollout.backend: ray: the jobs serve their policy in process, which Ray workers cannot reach; "
                "drive RolloutEngine with backend ray from Python against an HTTP gateway (docs/distributed.md)"
            )
        if self.swarm is not None and self.swarm.limits.max_subagent_steps < self.agent.max_turns:
            raise ValueError(
                f"swarm.limits.max_subagent_steps {self.swarm.limits.max_subagent_steps} < agent.max_turns "
                f"{self.agent.max_turns}: a sub-agent would be cut off before the turns the serial baseline gets"
            )
        budget = self.swarm and self.swarm.limits.max_critical_steps
        if budget is not None and budget < (round_trip := self.agent.max_turns + 2):
            raise ValueError(
                f"swarm.limits.max_critical_steps: {budget} leaves no room for one round of delegation "
                f"(1 + agent.max_turns {self.agent.max_turns} + the answer = {round_trip})"
            )
        return self

    @classmethod
    def load(cls, path: Path | None) -> JobConfig:
        """The YAML at `path` over the job's defaults, key by key: `rl: {train: {lr: 3e-4}}` changes the
        learning rate and keeps the job's other `rl.train` settings (ppo_epochs 2, mini_batches 2), which
        a block given whole would reset to TrainConfig's own defaults; `swarm: {limits: {subagent_timeout:
        60}}` keeps the swarm job's other limits and its λ anneals, as `code:` its settings."""
        given = {} if path is None else read_yaml(path) or {}
        return validated(cls, _over(cls().model_dump(), given) if isinstance(given, dict) else given, path)

    @classmethod
    def load_run(cls, folder: Path) -> JobConfig:
        """A run folder's own config.yaml. The job writes it whole, so a key it lacks is one added to harnessrl
        since: that key takes today's default, which may not be what the run used, and a warning names it."""
        path = folder / "config.yaml"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not a run folder")
        config = cls.load(path)
        given = read_yaml(path) or {}
        if unset := _unset(given, config.model_dump(mode="json")):
            warnings.warn(
                f"{path} does not set {', '.join(f'{k} (now {v!r})' for k, v in unset.items())}: it was written "
                "by an older harnessrl, and the run goes on with today's defaults; write a key into the file to "
                "keep another value",
                ConfigDefaultsWarning,
                stacklevel=1,  # located here, so a CLI that loads the run twice says it once
            )
        return config


class ConfigDefaultsWarning(UserWarning):
    """A run's config.yaml lacks keys, so they take today's defaults (JobConfig.load_run)."""


def _unset(given, resolved, prefix: str = "") -> dict:
    """Dotted keys of `resolved` that `given` leaves out, at any depth, with their resolved values."""
    if not (isinstance(given, dict) and isinstance(resolved, dict)):
        return {}
    unset = {}
    for key, value in resolved.items():
        if key not in given:
            unset[prefix + key] = value
        else:
            unset |= _unset(given[key], value, f"{prefix}{key}.")
    return unset


def _over(default, given):
    """`given` with every key it leaves out filled from `default`, recursively through mappings."""
    if not (isinstance(default, dict) and isinstance(given, dict)):
        return given
    if given.get("kind", default.get("kind")) != default.get("kind"):  # another kind of schedule: the default's
        return given  # other keys are its own kind's (`steps: 8` of a linear anneal), which the new kind refuses
    return default | {key: _over(default.get(key), value) for key, value in given.items()}
