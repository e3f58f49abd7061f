"""The main job: base model -> corpus and index -> expert demonstrations -> SFT warm start ->
held-out eval -> RL with the async rollout engine -> held-out eval, all in one run folder.

Run folder: config.yaml (resolved), demos.jsonl, sft/ (metrics.jsonl, checkpoints/),
eval_before.json / .jsonl, metrics.jsonl (RL), rollouts/update-NNNN.jsonl (the episodes RL update N
trained on), checkpoints/ (RL), validation.jsonl and best/ (the chosen weights), eval_after.json /
.jsonl, phases.json (seconds per finished phase, and of every start's setup; "sft (unfinished)" / "rl
(unfinished)": a phase's seconds up to its last save, in starts killed before it ended), rewards.png,
heldout.png, summary.json.

Checkpoint choice: `rl.validation_tasks` tasks of the train split are set aside (neither SFT nor RL
sees them), each hop count (number of gold documents) keeping its share of the split. Before RL and
every `rl.validate_every` updates the policy runs them (`rl.validation_repeats` sampled episodes
each); the weights with the best validation success (the later on a tie; update 0 is the warm start)
are kept in best/, and the held-out eval after RL runs them. With `rl.validation_p` below 1 (the default, 0.2),
an update competes only where it beats update 0 beyond noise (`validation_choice`). The test split is never used
to choose; a resumed run keeps the validation tasks its validation.jsonl names.

Each phase leaves its result in the folder, so `resume` skips finished phases and continues SFT or
RL from their newest checkpoint (the task order after an RL resume is re-drawn, not replayed).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import resource
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path

import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import AutoModelForCausalLM

from harnessrl.envs.search import SearchAgent, SearchIndex
from harnessrl.envs.search.errors import ERROR_CLASSES, error_class
from harnessrl.envs.search.expert import SearchExpert
from harnessrl.envs.search.reward import filter_demonstrations
from harnessrl.eval.evaluate import (
    RARE,
    falling,
    gain_ci,
    group_by_family,
    group_by_gold_docs,
    permutation_p,
    policy_draws,
    scores_by_task,
    succeeded,
    worse,
)
from harnessrl.eval.heldout import evaluate
from harnessrl.eval.plots import plot_heldout, plot_rewards
from harnessrl.eval.trend import training_trend
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.job.config import JobConfig
from harnessrl.policy import Policy
from harnessrl.policy.sources import PRESETS, SHIPPED, check_model
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.train import TrainConfig, Trainer, lora_for, precision
from harnessrl.train.checkpoint import latest_checkpoint, write_atomic
from harnessrl.types import Episode, Task, read_jsonl

log = logging.getLogger(__name__)

ADMIN = "harnessrl-job-admin"
# SFT steps after the warm-up that time its pace before the budget plans its length (`_Job._plan_sft`): a step's
# seconds vary 0.35-1.8x the mean, the mean of 14 steps 0.80-1.36x (2026-12-07, a 2-core Zen 3; the machine's own
# speed drifts too), so the plan is good to about a third and RL's budget takes up the rest
PACE_STEPS = 10
MAX_SKIPPED = 10  # SFT batches in a row whose step was skipped (a loss that was not finite) before the job gives up


def run(config: JobConfig, out: Path, progress: bool = True) -> dict:
    start_run(config, out)
    return asyncio.run(_Job(config, out, progress).run())


def start_run(config: JobConfig, out: Path) -> None:
    """A fresh run's folder, with its config.yaml. It may hold the same run (its finished phases are
    kept, as with resume) but never one whose config differs: its demos and checkpoints would be
    mixed in (a ValueError names the keys). A corpus or task file that does not load, or more synthetic people than
    the generator can name, fails here, before the folder holds the config (a retry with the mended file would be
    refused as another run); so does a `model:` that names nothing loadable (the CLI sets it without validation).
    Relative paths (data.corpus, data.tasks, code.tasks, a model folder or .gguf) are made absolute in `config` and
    its file, so `--resume` from another directory finds them."""
    check_model(config.model)  # a SourceError (ValueError) naming --model / model:; no weights are read
    _absolute(config)
    config.data.documents()  # files that do not load, or more people than the generator can name
    if (out / "config.yaml").is_file():
        held = JobConfig.load_run(out)
        _absolute(held)  # one written before its paths were made absolute: relative to here, as it was run
        changed = _changed(held.model_dump(mode="json"), config.model_dump(mode="json"))
        if changed:
            raise ValueError(
                f"{out} holds a run whose config differs in {', '.join(changed)}: continue it with"
                f" --resume {out}, or give another --out"
            )
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "config.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def _absolute(config: JobConfig) -> None:
    """The config's paths made absolute, in place: its files and model folders, the swarm's sub-agent's too."""
    data = config.data
    data.corpus, data.tasks = data.corpus and data.corpus.resolve(), data.tasks and data.tasks.resolve()
    if config.code is not None and config.code.tasks is not None:
        config.code.tasks = config.code.tasks.resolve()
    config.model = _model_path(config.model)
    if (swarm := config.swarm) is not None:
        swarm.subagent_run = swarm.subagent_run.resolve()
        swarm.subagent_config = swarm.subagent_config and swarm.subagent_config.resolve()
        swarm.subagent_model, swarm.subagent_base = map(_model_path, (swarm.subagent_model, swarm.subagent_base))


def _model_path(model: str | None) -> str | None:
    """A model folder or .gguf file as an absolute path; a name (tiny, a shipped base, a preset) as it is."""
    if model is None or model == "tiny" or model in SHIPPED or model in PRESETS:
        return model
    return str(Path(model).resolve())


def _changed(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    keys = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _changed(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(prefix + key)
    return keys


def _within(key: str, blocks: tuple[str, ...]) -> bool:
    """Whether a dotted key is one of `blocks` or inside one."""
    return any(key == b or key.startswith(f"{b}.") for b in blocks)


def resume(out: Path, progress: bool = True) -> dict:
    """Continue the run in `out` with its own config.yaml."""
    return asyncio.run(_Job(JobConfig.load_run(out), out, progress).run())


# what `from_warm_start` copies: the phases before RL, and their seconds (so wall_seconds stays the whole job's)
WARM_START_FILES = ("demos.jsonl", "sft", "eval_before.json", "eval_before.jsonl", "eval_before_greedy.jsonl")
WARM_START_PHASES = ("demos", "sft", "eval_before")
# config keys (and blocks) that do not change what those made: budget_seconds and sft.budget_share fitted SFT to the
# budget once, and the copy keeps its source's sft/plan.json
WARM_START_FREE = ("rl", "reward", "prefix_cache", "loggers", "budget_seconds", "sft.budget_share")
WARM_START_BOUND = ("rl.validation_tasks", "rl.fresh_tasks", "rl.train.lora")  # ... but these do (the tasks, LoRA)


def from_warm_start(config: JobConfig, out: Path, source: Path, progress: bool = True) -> dict:
    """Run `config` from the warm start of the finished run `source`: its demonstrations, SFT weights and held-out
    eval before are copied into `out`, so only RL and the eval after run. Comparing RL configs this way takes half a
    job each and pairs them on one warm start. `config` must agree with `source`'s in every key that made those
    phases (all but rl, reward, prefix_cache, loggers, budget_seconds and sft.budget_share; and rl.validation_tasks,
    rl.fresh_tasks, rl.train.lora): a ValueError names the keys that differ. SFT stays as long as `source`'s plan made
    it (sft/plan.json), whatever this config's budget."""
    made = JobConfig.load_run(source)
    _absolute(made)
    _absolute(config)
    if not (source / "eval_before.json").is_file():
        raise ValueError(f"--warm-start {source}: its warm start is not finished (no eval_before.json)")
    changed = [
        key
        for key in _changed(made.model_dump(mode="json"), config.model_dump(mode="json"))
        if not _within(key, WARM_START_FREE) or _within(key, WARM_START_BOUND)
    ]
    if changed:
        raise ValueError(
            f"--warm-start {source}: the config differs in {', '.join(changed)}, which made its warm start"
        )
    marker, origin = out / "warm_start.json", {"from": str(source.resolve())}
    if (out / "config.yaml").is_file() and (not marker.is_file() or json.loads(marker.read_text()) != origin):
        raise ValueError(f"{out} holds a run not started from the warm start of {source}: give another --out")
    start_run(config, out)  # refuses a folder holding this warm start's copy with another config
    marker.write_text(json.dumps(origin))
    for name in WARM_START_FILES:  # each copied whole, then renamed: a copy cut short is made again
        if (source / name).exists() and not (out / name).exists():
            partial = out / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            (shutil.copytree if (source / name).is_dir() else shutil.copyfile)(source / name, partial)
            partial.rename(out / name)
    seconds = json.loads((source / "phases.json").read_text()) if (source / "phases.json").is_file() else {}
    phases = out / "phases.json"
    done = json.loads(phases.read_text()) if phases.is_file() else {}
    write_atomic(phases, json.dumps({k: seconds[k] for k in WARM_START_PHASES if k in seconds} | done, indent=1))
    return asyncio.run(_Job(config, out, progress).run())


def _unfinished(phase: str) -> str:
    """phases.json's key for a phase's seconds up to its last save, in starts killed before it ended."""
    return f"{phase} (unfinished)"


class _Job:
    VALIDATION_METRIC = "success"  # what validation.jsonl records per update and best/ maximises

    def __init__(self, config: JobConfig, out: Path, progress: bool):
        self.config, self.out, self.progress = config, out, progress
        self.rl_updates = 0  # updates RL has made (fewer than rl.updates where budget_seconds ended it)
        self.validation: list[Task] = []  # train tasks set aside to choose the checkpoint (none: the last)
        phases = out / "phases.json"
        self.seconds: dict[str, float] = json.loads(phases.read_text()) if phases.is_file() else {}

    async def run(self) -> dict:
        config, out, started = self.config, self.out, time.perf_counter()
        random.seed(config.seed)
        docs, items = config.data.documents()
        train = [t.task() for t in items if t.split == "train"]
        test = [t.task() for t in items if t.split == "test"][: config.eval_tasks]
        if not train or not test:
            raise ValueError(f"the tasks need both splits: {len(train)} train, {len(test)} test")
        size = min(config.rl.validation_tasks, len(train) // 4)
        if records := self._validation_records():  # resumed: the split the run started with
            named = set(records[0]["tasks"])
            self.validation = [t for t in train if t.id in named]
        else:
            self.validation = validation_split(train, size, random.Random(f"{config.seed}:validation"))
        train = [t for t in train if t not in self.validation]
        demonstrated, fresh = fresh_split(train, config.rl.fresh_tasks, config.seed)
        index = SearchIndex(docs, out / "index", source=str(config.data.corpus or "the synthetic corpus"))
        self.policy = Policy.load(config.model, seed=config.seed, tool_format=config.tool_format)
        self.lora = lora_for(self.policy.model, config.lora, config.rl.train.lora)  # for SFT and RL
        self.policy.engine.prefill_share = None  # rollouts want throughput: prefill as fast as it comes (engine.py)
        self.policy.engine.prefix_cache = config.prefix_cache
        self.gateway = GatewayClient(ADMIN, app=create_app(self.policy, ADMIN))
        a = config.agent
        agent = SearchAgent(index, a.context_budget, a.max_turns, a.k, a.max_tokens, temperature=1.0)
        greedy = SearchAgent(index, a.context_budget, a.max_turns, a.k, a.max_tokens, temperature=0.0)
        reward = config.reward.build()
        if self.progress:  # bf16 on a CPU without it is 15x slower than fp32: say which one this run uses
            print(
                f"sft: {precision.resolve(config.sft.precision)[1]}; rl: {precision.resolve(config.rl.train.precision)[1]}"
            )
            if (budget := config.budget()) is not None:  # SFT and RL may end early: say so before they do
                print(
                    f"budget: {budget:.0f} s of wall_seconds (budget_seconds: {config.budget_seconds}; null for every step and update)"
                )
        self.seconds["setup"] = (
            self.seconds.get("setup", 0.0) + time.perf_counter() - started
        )  # corpus, index, model: every start
        try:
            demos = []
            if config.sft.steps or config.rl.guidance:
                demos = await self._phase("demos", lambda: self._demos(agent, reward, demonstrated))
            if config.sft.steps:
                await self._phase("sft", lambda: self._sft(demos))
            before = await self._phase("eval_before", lambda: self._eval("eval_before", agent, greedy, test))
            guides = {d.task.id: d for d in demos if d.succeeded} if config.rl.guidance else None
            await self._phase(
                "rl",
                lambda: self._run_rl(agent, reward, fresh or train, config.rl.rollout, _batch_by_gold_docs, guides),
            )
            chosen = self._load_best()
            if chosen["update"] == 0:  # validation kept the warm start: the weights eval_before measured
                self._reuse_eval_before()
            after = await self._phase("eval_after", lambda: self._eval("eval_after", agent, greedy, test))
        finally:
            await self.gateway.aclose()
            self.policy.close()
        held = {when: read_jsonl(self.out / f"eval_{when}.jsonl", Episode) for when in ("before", "after")}
        greedy_held = {w: read_jsonl(self.out / f"eval_{w}_greedy.jsonl", Episode) for w in ("before", "after")}
        documents = {d.id: d for d in docs}
        warm = out / "warm_start.json"
        summary = {
            "heldout_tasks": len(test),
            "heldout_success_before": before["sampled"],
            "heldout_success_after": after["sampled"],
            "heldout_success_greedy_before": before["greedy"],
            "heldout_success_greedy_after": after["greedy"],
            "heldout_gain_ci": gain_ci(held["before"], held["after"]),
            "heldout_gain_ci_greedy": gain_ci(greedy_held["before"], greedy_held["after"]),
            "heldout_alarms": _heldout_alarms(held, greedy_held, documents),
            "heldout_by_gold_docs": _heldout_by(held, group_by_gold_docs),
            "heldout_by_family": _heldout_by(held, group_by_family),
            **{f"error_classes_{when}": _error_classes(episodes, documents) for when, episodes in held.items()},
            **{f"rare_draws_{when}": _rare_per_1k(episodes) for when, episodes in held.items()},
            "rl_updates": self.rl_updates,
            "budget_seconds": config.budget(),
            "budget_stop": self._budget_stop(),
            "sft_plan": self._read_sft_plan(),
            "training_trend": training_trend(out / "metrics.jsonl"),
            "chosen_update": chosen["update"],
            "validation": chosen["validation"],
            "wall_seconds": sum(self.seconds.values()),
            "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,  # this process, Linux: KiB
            "phase_seconds": self.seconds,
            "warm_start": json.loads(warm.read_text())["from"] if warm.is_file() else None,  # from_warm_start's source
        }
        write_atomic(out / "summary.json", json.dumps(summary, indent=1))
        for alarm in summary["training_trend"]["alarms"]:  # found, to be explained: never averaged away
            log.warning("training alarm: %s over RL (summary.json's training_trend; rewards.png)", alarm)
        warn_heldout_alarms(summary)
        if (out / "metrics.jsonl").exists():
            plot_rewards(out / "metrics.jsonl", out / "rewards.png")
        plot_heldout(summary, out / "heldout.png")
        return summary

    async def _phase(self, name: str, work):
        """Run one phase (each returns its result, reading it back when already done) and time it. A phase that
        saves as it goes (SFT, RL) records its seconds so far at each save (`_phase_progress`) as "NAME (unfinished)",
        so the time of a start killed mid-phase stays in wall_seconds and the budget after a resume."""
        self._current = (name, time.perf_counter())
        result = await work()
        unfinished = _unfinished(name)
        if name not in self.seconds or unfinished in self.seconds:  # a finished phase may go on (more sft.steps)
            self.seconds[name] = self.seconds.get(name, 0.0) + self._phase_seconds()
            self.seconds.pop(unfinished, None)
            self._write_phases()
        return result

    def _phase_seconds(self) -> float:
        """Seconds of the running phase: this start's, and those of earlier starts that ended before it did."""
        name, started = self._current
        return self.seconds.get(_unfinished(name), 0.0) + time.perf_counter() - started

    def _job_seconds(self) -> float:
        """The job's seconds so far, in the running phase: every phase's recorded seconds (a finished one that goes
        on, with more sft.steps or rl.updates, too) and the running one's (`_phase_seconds`, its unfinished ones in)."""
        unfinished = _unfinished(self._current[0])
        return sum(v for k, v in self.seconds.items() if k != unfinished) + self._phase_seconds()

    def _phase_progress(self) -> None:
        """After a save of the running phase: its seconds so far into phases.json."""
        name, _ = self._current
        self.seconds[_unfinished(name)], self._current = self._phase_seconds(), (name, time.perf_counter())
        self._write_phases()

    def _write_phases(self) -> None:
        write_atomic(self.out / "phases.json", json.dumps(self.seconds, indent=1))

    async def _demos(self, agent: SearchAgent, reward, train) -> list[Episode]:
        path = self.out / "demos.jsonl"
        if path.is_file():
            return read_jsonl(path, Episode)
        demos = []
        for rep in range(self.config.sft.demos_per_task):  # each repetition rolls the expert's imperfections anew
            expert = SearchExpert(agent, seed=self.config.seed * 1000 + rep)
            engine = RolloutEngine(self.gateway, expert, reward, RolloutConfig(group_size=2))
            demos += [await engine.episode(t) for t in train]
        _dump(path, demos)
        return demos

    async def _sft(self, demos: list[Episode]) -> None:
        cfg = self.config.sft
        # a failed one (the expert's episode raised, e.g. at a document read past the model's context) has its first
        # steps and never the answer
        failed = [e for e in demos if e.status == "failed"]
        if failed:
            log.warning("%d of %d demonstrations failed and are left out of SFT; the first: %s", len(failed),
                        len(demos), failed[0].failure_reason)  # fmt: skip
            demos = [e for e in demos if e.status != "failed"]
        if cfg.filter is not None:  # Context-1's recall filter; counts at each threshold in sft/filter.json
            demos, counts = filter_demonstrations(demos, cfg.filter)
            (self.out / "sft").mkdir(parents=True, exist_ok=True)
            write_atomic(self.out / "sft" / "filter.json", json.dumps(counts, indent=1))
            if not demos:
                raise ValueError(f"sft.filter kept no demonstration of {counts['episodes']}: {counts}")
        # a plan made for this sft.steps holds, budget or not: a --warm-start copy of a fitted SFT is that SFT
        budget, plan = self.config.budget(), self._read_sft_plan()
        plan = plan if plan and plan["of"] == cfg.steps else None
        steps = plan["steps"] if plan else cfg.steps
        train_cfg = TrainConfig(
            lr=cfg.lr,
            name_weight=cfg.name_weight,
            schedule=cfg.schedule,
            total_steps=steps,
            warmup_steps=min(5, cfg.steps // 10, steps - 1),  # a budget fitted to a few steps still decays
            precision=cfg.precision,
            lora=self.lora,
            seed=self.config.seed,
        )
        trainer = Trainer(
            self.policy.model,
            self.policy.tokenizer,
            train_cfg,
            run_dir=self.out / "sft",
            policy=self.policy,
            loggers=self.config.loggers,
        )
        checkpoints = self.out / "sft" / "checkpoints"
        # batches drawn: batch N depends on the seed and N alone, so a resumed run trains as one that ran on would
        draws = 0
        if (latest := latest_checkpoint(checkpoints)) is not None:
            draws = trainer.resume(latest).get("draws", trainer.step)
        else:
            trainer.forget_after(0)  # a start that stopped before its first checkpoint
        demos = [e for e in demos if any(c.trainable and c.completion_ids for c in e.calls)]  # the others train nothing
        if not demos:
            reason = f" ({len(failed)} failed; the first: {failed[0].failure_reason})" if failed else ""
            raise ValueError(f"{self.out / 'demos.jsonl'}: no demonstration has a completion to train on{reason}")
        paces: list[float] = []  # this start's seconds per step
        skipped = 0  # batches in a row that made no step
        with _bar("sft", self.progress) as bar:
            job = bar.add_task("sft", total=steps, completed=trainer.step, status="")
            while trainer.step < steps:
                started = time.perf_counter()
                batch = random.Random(f"{self.config.seed}:sft:{draws}").sample(
                    demos, min(cfg.batch_episodes, len(demos))
                )
                draws += 1
                metrics = await asyncio.to_thread(trainer.sft_step, batch)
                paces.append(time.perf_counter() - started)
                timed = len(paces) >= PACE_STEPS and trainer.step >= train_cfg.warmup_steps + PACE_STEPS
                if not plan and budget is not None and (timed or trainer.step >= steps):
                    plan = self._plan_sft(trainer, paces)
                    steps = plan["steps"]
                    bar.update(job, total=steps)
                if "loss/sft" not in metrics:  # skipped (a loss that was not finite): no step; the next batch is drawn
                    skipped += 1
                    if skipped == MAX_SKIPPED:
                        raise ValueError(
                            f"sft: {skipped} batches in a row at step {trainer.step} had a loss or gradient that was "
                            f"not finite: lower sft.lr ({cfg.lr}) or check the demonstrations"
                        )
                    continue
                skipped = 0
                bar.update(job, completed=trainer.step, status=f"loss {metrics['loss/sft']:.3f}")
                if trainer.step % cfg.save_every == 0 or trainer.step == steps:
                    trainer.save(checkpoints, cursor={"draws": draws})
                    self._phase_progress()

    def _plan_sft(self, trainer: Trainer, paces: list[float]) -> dict:
        """SFT's length under the time budget, planned once, PACE_STEPS after its warm-up (and PACE_STEPS timed in this
        start): the steps that end by `sft.budget_share` of the budget at the pace of this start's steps (the first
        left out: it is slower), at most sft.steps. The schedule decays over them from there (`Trainer.reschedule`; at
        step 15 a cosine over 230 steps has decayed by 0.5 %, over 115 by 2 %, over 54 by 8 %); sft/plan.json keeps
        them for a resume and a --warm-start copy. Its pace leaves out the checkpoint saves (one every 20 steps)."""
        cfg, budget = self.config.sft, self.config.budget()
        pace, spent = statistics.fmean(paces[1:] or paces), self._job_seconds()
        steps = min(cfg.steps, trainer.step + max(0, int((budget * cfg.budget_share - spent) / pace)))
        record = {"steps": steps, "of": cfg.steps, "planned_at": trainer.step, "seconds_per_step": round(pace, 3),
                  "seconds_at_plan": round(spent, 1), "until_seconds": round(budget * cfg.budget_share, 1)}  # fmt: skip
        write_atomic(self.out / "sft" / "plan.json", json.dumps(record))  # sft/: the trainer's run_dir
        if steps < cfg.steps:
            log.warning("sft: %d of sft.steps %d, %.1f s a step, to end by %.0f s of the budget's %.0f (sft.budget_share "
                        "%s; budget_seconds: null trains them all in a run of its own)", steps, cfg.steps, pace,
                        record["until_seconds"], budget, cfg.budget_share)  # fmt: skip
        if steps != trainer.config.total_steps:
            trainer.reschedule(steps)
        return record

    async def _eval(self, name: str, agent: SearchAgent, greedy: SearchAgent, test) -> dict:
        path = self.out / f"{name}.json"
        if path.is_file():
            return json.loads(path.read_text())
        repeats = self.config.eval_repeats
        sampled, episodes = await evaluate(self.gateway, agent, [t for t in test for _ in range(repeats)])
        greedy_success, greedy_episodes = await evaluate(self.gateway, greedy, test)
        _dump(self.out / f"{name}.jsonl", episodes)
        _dump(self.out / f"{name}_greedy.jsonl", greedy_episodes)
        result = {
            "sampled": sampled,
            "greedy": greedy_success,
            "tasks": len(test),
            "sampled_repeats": repeats,
            "policy_version": self.policy.version,
        }
        write_atomic(path, json.dumps(result, indent=1))  # it marks the phase done: a torn one would stop a resume
        return result

    def _reuse_eval_before(self) -> None:
        """eval_before's files stand for eval_after when the chosen weights are the ones eval_before ran: a second
        sampled draw of the same weights differs by noise alone (seed 2 of 2026-12-04: 0.182 and 0.068 over the
        same 88 episodes' tasks, greedy identical), which the summary would report as RL's gain."""
        if (self.out / "eval_after.json").is_file() or not (self.out / "eval_before.json").is_file():
            return
        files = [p for p in self.out.glob("eval_before*") if p.suffix in (".json", ".jsonl")]
        for path in sorted(files, key=lambda p: p.suffix == ".json"):  # each .json last: it marks its phase done
            write_atomic(self.out / path.name.replace("eval_before", "eval_after", 1), path.read_text(encoding="utf-8"))

    async def _run_rl(self, harness, reward, train, rollout, batch_metrics=None, guides=None) -> None:
        """RL from the newest checkpoint up to `rl.updates`, shared by every job: the trainer (LoRA when the
        job chose it), validation of `self.validation` (if any) before the first update of a fresh run and
        every `rl.validate_every` updates, and a checkpoint every `save_every` updates (numbered by update:
        an update whose groups all tied keeps trainer.step as it was). With `budget_seconds`, RL ends (validated
        and saved) at the first update after which one more update as slow as the slowest so far, a validation and the
        eval after would not fit (`_over_budget`); budget_stop.json records where, so a resumed run does not go on."""
        cfg = self.config.rl
        trainer = Trainer(self.policy.model, self.policy.tokenizer, cfg.train.model_copy(update={"lora": self.lora}),
                          run_dir=self.out, policy=self.policy, loggers=self.config.loggers)  # fmt: skip
        checkpoints = self.out / "checkpoints"
        done = 0
        if (latest := latest_checkpoint(checkpoints)) is not None:
            done = trainer.resume(latest).get("updates", trainer.step)
            trainer.forget_after(trainer.step, lines=done)  # a line an update, skipped ones included
        else:
            trainer.forget_after(0)
        self.rl_updates = done
        if done == 0 or done % cfg.validate_every == 0 or done == cfg.updates:  # a kill in a validation: it again
            await self._validate(done, harness, trainer)
        if cfg.updates - done <= 0 or self._budget_stop() is not None:
            return
        if stop := self._over_budget(0.0, done):  # no time for an update (or, resumed, for another one)
            await self._validate(done, harness, trainer)
            self._end_rl(stop)
            return
        loop = asyncio.get_running_loop()
        rollouts = self.out / "rollouts"  # what each update trained on
        rollouts.mkdir(exist_ok=True)
        # an update's seconds: from the end of the last one's bookkeeping (validation, checkpoint) to its own end
        last, slowest = time.perf_counter(), 0.0

        def checkpoint(_: dict, episodes: list[Episode]) -> bool:  # in the training thread, while rollouts go on
            nonlocal done, last, slowest
            done, slowest = done + 1, max(slowest, time.perf_counter() - last)
            self.rl_updates = done
            _dump(rollouts / f"update-{done:04d}.jsonl", episodes)

            saved = False

            def save() -> None:
                nonlocal saved
                if not saved:
                    trainer.save(checkpoints, cursor={"updates": done}, number=done)
                    self._phase_progress()
                    saved = True

            def validate() -> None:  # saved first: best/ never holds an update a resumed run would redo
                save()
                asyncio.run_coroutine_threadsafe(self._validate(done, harness, trainer), loop).result()

            if done % cfg.validate_every == 0 or done == cfg.updates:
                validate()
            stop = self._over_budget(slowest, done) if done < cfg.updates else None
            if stop:  # the last update: validated (a no-op where it just was) and saved
                validate()
            if done % cfg.save_every == 0:
                save()
            if stop:
                self._end_rl(stop)
            last = time.perf_counter()
            return stop is not None

        engine = RolloutEngine(self.gateway, harness, reward, rollout, guides)
        tasks = itertools.cycle(random.Random(f"{self.config.seed}:{done}").sample(train, len(train)))
        await engine.train(trainer, tasks, cfg.updates - done, self.progress, checkpoint, batch_metrics)

    def _over_budget(self, per_update: float, done: int) -> dict | None:
        """Where RL ends (budget_stop.json's record), if the job would pass `budget_seconds` with one more update
        (`per_update` seconds: the slowest so far, since one update can take twice the mean; 0 before the first), a
        validation (the last one's seconds) and the eval after: the eval before's seconds, scaled by how much longer
        the last validation took than update 0's (the policy's episodes grow or shrink: eval after / eval before was
        1.00-1.30 in 16 runs of 2026-12-05)."""
        budget = self.config.budget()
        if budget is None:
            return None
        spent = self._job_seconds()
        seconds = [r["seconds"] for r in self._validation_records() if r.get("seconds")] or [0.0]
        growth = seconds[-1] / seconds[0] if seconds[0] else 1.0
        evaluation = sum(v for k, v in self.seconds.items() if k.startswith("eval_before")) * growth
        projected = spent + per_update + seconds[-1] + evaluation
        if projected <= budget:
            return None
        return {"update": done, "seconds": round(spent, 1), "projected_seconds": round(projected, 1), "budget": budget}

    def _end_rl(self, stop: dict) -> None:
        """RL ended at the budget (its last update validated and saved): budget_stop.json, so a resume does not go on."""
        log.warning("budget_seconds %s: RL ends at update %d of %d (projected %.0f s)", stop["budget"], stop["update"],
                    self.config.rl.updates, stop["projected_seconds"])  # fmt: skip
        write_atomic(self.out / "budget_stop.json", json.dumps(stop))

    def _read_sft_plan(self) -> dict | None:
        """sft/plan.json: SFT's length under the budget (`_plan_sft`), or None."""
        path = self.out / "sft" / "plan.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def _budget_stop(self) -> dict | None:
        """budget_stop.json: where the time budget ended RL ({update, seconds, projected_seconds, budget}), or None."""
        path = self.out / "budget_stop.json"
        return json.loads(path.read_text()) if path.is_file() else None

    async def _validate(self, update: int, harness, trainer: Trainer) -> None:
        """Validation score of the current weights; they go to best/ when no earlier update beat them."""
        self._mend_best()
        records = self._validation_records()
        if not self.validation or any(r["update"] == update for r in records):
            return
        episodes = [t for t in self.validation for _ in range(self.config.rl.validation_repeats)]
        begun = time.perf_counter()
        scores = await self._validation_scores(harness, episodes)
        score = _mean_score(scores)
        p, eligible, best = validation_choice(records, scores, self.VALIDATION_METRIC, self.config.rl.validation_p)
        if best:
            tmp = self.out / ".best.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            await asyncio.to_thread(trainer.write_model, tmp)
            (tmp / "chosen.json").write_text(json.dumps({"update": update, "validation": score}))
            old = self.out / ".best.old"  # the previous choice stays whole until the new one is in place
            shutil.rmtree(old, ignore_errors=True)
            if (self.out / "best").exists():
                (self.out / "best").replace(old)
            tmp.replace(self.out / "best")
            shutil.rmtree(old, ignore_errors=True)
        record = {
            "update": update,
            self.VALIDATION_METRIC: score,
            "episodes": len(episodes),
            "tasks": [t.id for t in self.validation],
            "seconds": round(time.perf_counter() - begun, 2),
            "scores": scores,
            "p_above_update_0": p,
            "eligible": eligible,
        }
        with open(self.out / "validation.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def _validation_records(self) -> list[dict]:
        """validation.jsonl: one record per validated update ({update, success, episodes, tasks, seconds, scores,
        p_above_update_0, eligible}). A last line a kill cut short is dropped from the file (that update is
        validated again); a bad line elsewhere is an error naming it."""
        path = self.out / "validation.jsonl"
        lines = path.read_text().splitlines(keepends=True) if path.is_file() else []
        records = []
        for number, line in enumerate(lines, start=1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                if number == len(lines) and not line.endswith("\n"):  # cut short by a kill
                    break
                raise ValueError(f"{path}: line {number}: not JSON ({exc.msg})") from None
        if lines and not lines[-1].endswith("\n"):  # the cut line dropped (or a whole one ended): appends start a line
            log.warning(
                "%s: a last line without its newline (%s)", path, "kept" if len(records) == len(lines) else "dropped"
            )
            write_atomic(path, "".join(line.rstrip("\n") + "\n" for line in lines[: len(records)]))
        return records

    def _mend_best(self) -> None:
        """A kill between moving best/ aside and putting the new one in place: the previous choice comes back."""
        old, best = self.out / ".best.old", self.out / "best"
        if old.exists() and not best.exists():
            old.replace(best)

    async def _validation_scores(self, harness, tasks: list[Task]) -> dict[str, list[float]]:
        """Each validation task's scores, one an episode (success; the swarm job's item-F1)."""
        return scores_by_task((await evaluate(self.gateway, harness, tasks))[1], succeeded)

    def _load_best(self) -> dict:
        """Serve the chosen weights (best/); without validation, the last ones."""
        self._mend_best()
        chosen = self.out / "best" / "chosen.json"
        if not chosen.is_file():
            return {"update": self.rl_updates, "validation": None}
        model = AutoModelForCausalLM.from_pretrained(self.out / "best", dtype=self.policy.model.dtype)
        self.policy.update_weights(model.state_dict())
        return json.loads(chosen.read_text())


def validation_choice(
    records: list[dict], scores: dict[str, list[float]], metric: str, validation_p: float
) -> tuple[float | None, bool, bool]:
    """(p_above_update_0, eligible, best) of a validation's `scores` (each task's, one an episode) after the earlier
    `records` (validation.jsonl's): p is the one-sided permutation p (paired by task) that they beat update 0's by
    chance alone (None for update 0, or where its record kept no scores); the update is eligible where p is at most
    `validation_p`, and best where eligible and it scores at least every eligible earlier update (the later on a
    tie): its weights go to best/."""
    p = None
    if records and "scores" in records[0]:
        warm = records[0]["scores"]
        tasks = [t for t in scores if t in warm]
        p = round(permutation_p([scores[t] for t in tasks], [warm[t] for t in tasks]), 4)
    eligible = p is None or p <= validation_p
    earlier = max((r[metric] for r in records if r.get("eligible", True)), default=-1.0)
    return p, eligible, eligible and _mean_score(scores) >= earlier


def _mean_score(scores: dict[str, list[float]]) -> float:
    """The mean over every episode of each task's scores."""
    return sum(map(sum, scores.values())) / max(1, sum(map(len, scores.values())))


def validation_split(train: list[Task], size: int, rng: random.Random) -> list[Task]:
    """`size` train tasks that keep each hop count's share of `train` (by the number of gold documents a task
    needs; shares rounded by largest remainder), drawn at random within each. A plain draw of 16 from the
    synthetic train split (64 / 67 / 65 tasks of 1 / 2 / 3 hops) held 2 / 4 / 10 for seed 0: validation then
    succeeded at 0.06 where the held-out mix did at 0.18, and told the checkpoints apart by 1-2 episodes.
    `fresh_split` draws RL's own tasks with it too (another seed string, from what validation left)."""
    strata: dict[int, list[Task]] = {}
    for task in train:
        strata.setdefault(len(task.data.get("gold_doc_ids", [])), []).append(task)
    quotas = {hops: size * len(tasks) / len(train) for hops, tasks in sorted(strata.items())}
    counts = {hops: int(q) for hops, q in quotas.items()}
    by_remainder = sorted(quotas, key=lambda h: quotas[h] - counts[h], reverse=True)
    for hops in by_remainder[: size - sum(counts.values())]:
        counts[hops] += 1  # the largest remainders take what the floors left
    return [task for hops, tasks in sorted(strata.items()) for task in rng.sample(tasks, counts[hops])]


def fresh_split(train: list[Task], share: float, seed: int) -> tuple[list[Task], list[Task]]:
    """(demonstrated, fresh): `share` of the train tasks, each hop count keeping its share, set aside for RL
    alone (`rl.fresh_tasks`); the rest are demonstrated for SFT. RL draws from the fresh ones when there are any.
    On the demonstrated tasks RL finds what SFT memorised (after a 300-step wsd SFT, seed 1, its batches succeeded
    at 0.78-1.0 in 22 of 24 updates where held-out tasks did at 0.59; 2026-12-05), and a group that all succeeds
    teaches nothing."""
    fresh = validation_split(train, round(share * len(train)), random.Random(f"{seed}:fresh"))
    return [t for t in train if t not in fresh], fresh


ALARM_MIN_TASKS = 5


def _heldout_alarms(held: dict[str, list[Episode]], greedy: dict[str, list[Episode]], documents) -> list[str]:
    """What RL made worse on the held-out tasks beyond noise (`worse`: a permutation test paired by task):
    `sampled_falling` / `greedy_falling` (success), `FAMILY_falling` (sampled success of the tasks of one
    family, e.g. `birth_year_falling`: the hop trade), `CLASS_rising` (the share of sampled episodes in a
    failure class of envs/search/errors.py, e.g. `malformed_call_rising`). A mean gain can hide each. A family
    of fewer than `ALARM_MIN_TASKS` tasks is not named: a few of its tasks say little about the family."""
    after = group_by_family(held["after"])
    families = {family: {"before": before, "after": after[family]}
                for family, before in group_by_family(held["before"]).items()
                if family in after and len({e.task.id for e in before}) >= ALARM_MIN_TASKS}  # fmt: skip
    alarms = falling({"sampled": held, "greedy": greedy}) + falling(families)
    classes = {id(e): error_class(e, documents) for episodes in held.values() for e in episodes}  # once each
    for name in ERROR_CLASSES[1:]:  # every class but ok
        if worse(held["before"], held["after"], lambda e, name=name: classes[id(e)] == name, sign=-1):
            alarms.append(f"{name}_rising")
    return alarms


def warn_heldout_alarms(summary: dict) -> None:
    for alarm in summary["heldout_alarms"]:  # found, to be explained: never averaged away
        log.warning("held-out alarm: %s after RL, beyond noise (summary.json's heldout_alarms)", alarm)


def _heldout_by(held: dict[str, list[Episode]], group) -> dict[str, dict]:
    """Sampled held-out success and model calls per episode, before and after RL (`held`'s keys), per
    `group` of tasks: how many gold documents a task needs ("1": a lookup, "2" and more: a chain of hops)
    or its family, so that a gain on one kind bought with a loss on another shows (e.g. RL learning to
    answer after the first document)."""
    rows: dict[str, dict] = {}
    for when, all_episodes in held.items():
        for n, (tasks, success, calls) in _success_and_calls(all_episodes, group).items():
            row = rows.setdefault(n, {"tasks": tasks})
            row[f"success_{when}"], row[f"calls_{when}"] = round(success, 4), round(calls, 2)
    return rows


def _batch_by_gold_docs(episodes: list[Episode], _step: int) -> dict[str, float]:
    """A training batch's success and model calls per episode by gold documents per task (`hops/success_N`,
    `hops/calls_N`): what RL trades, e.g. lookups gained by answering chains after their first document."""
    metrics = {}
    for n, (_, success, calls) in _success_and_calls(episodes, group_by_gold_docs).items():
        metrics[f"hops/success_{n}"], metrics[f"hops/calls_{n}"] = success, calls
    return metrics


def _success_and_calls(episodes: list[Episode], group) -> dict[str, tuple[int, float, float]]:
    """Per `group` of tasks (gold documents needed, family): distinct tasks, success and model calls per episode."""
    return {
        n: (len({e.task.id for e in members}), sum(map(succeeded, members)) / len(members),
            sum(len(e.calls) for e in members) / len(members))
        for n, members in group(episodes).items()
    }  # fmt: skip


def _rare_per_1k(episodes: list[Episode]) -> float:
    """Tokens sampled at p < 1 % (eval.evaluate.rare_draws) per 1,000 tokens the sampled held-out episodes drew."""
    drawn = [lp for e in episodes for lp in policy_draws(e.calls)]
    return round(1000 * sum(lp < RARE for lp in drawn) / max(1, len(drawn)), 2)


def _error_classes(episodes: list[Episode], documents) -> dict[str, int]:
    """Sampled held-out episodes per error class (envs/search/errors.py), most frequent first."""
    counts = Counter(error_class(e, documents) for e in episodes)
    return dict(counts.most_common())


def _bar(label: str, progress: bool) -> Progress:
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        disable=not progress,
    )


def _dump(path: Path, episodes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(e.to_json() + "\n" for e in episodes))
    tmp.replace(path)
