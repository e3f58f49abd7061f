"""The swarm job: a trainable orchestrator learns to delegate wide research to frozen search sub-agents.

wide tasks (envs/wide) from the job's corpus -> the frozen sub-agent (a search main job's best/,
trained first if absent) -> a scripted orchestrator's demonstrations -> SFT -> held-out eval of
the orchestrator and of the single search agent doing the questions in turn (the baseline) ->
orchestrator RL with the PARL reward (item-F1 + annealed r_parallel and r_finish), swarm metrics
and alarms in metrics.jsonl -> held-out eval of the weights chosen on validation: `rl.validation_tasks`
wide tasks of train questions set aside (no training task holds them; at most a quarter of the train
questions), run before RL and every `rl.validate_every` updates; the update the main job's rule picks
on their item-F1 (`rl.validation_p`: beyond noise over update 0, the SFT weights, then the best; job/main.py)
goes to best/ (validation.jsonl, chosen_update in summary.json).

Run folder: config.yaml, demos.jsonl, sft/, baseline.json / .jsonl, scripted.json / .jsonl (the
scripted orchestrator on the held-out tasks: what delegation alone gives), eval_before.json / .jsonl
(and eval_before_greedy: the orchestrator decoding greedily, one episode a task),
metrics.jsonl and checkpoints/ (RL), validation.jsonl and best/, eval_after.json / .jsonl (and _greedy), phases.json,
rewards.png, swarm.png, summary.json.
`resume` skips finished phases, as the main job's does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import resource
import time
from pathlib import Path

from harnessrl.calltree import critical_steps
from harnessrl.envs.search import SearchAgent, SearchIndex
from harnessrl.envs.wide import OrchestratorExpert, SerialSearch, WideOrchestrator, item_f1, wide_reward
from harnessrl.envs.wide.tasks import set_aside, wide_tasks
from harnessrl.eval.evaluate import falling, gain_ci, scores_by_task
from harnessrl.eval.heldout import evaluate
from harnessrl.eval.plots import plot_curves, plot_rewards
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.gateway.models import Pinned
from harnessrl.job import main
from harnessrl.job.config import JobConfig
from harnessrl.policy import Policy
from harnessrl.policy.sources import SourceError, check_model
from harnessrl.rewards.parl import SwarmAlarms, swarm_metrics
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.train import lora_for
from harnessrl.train.checkpoint import write_atomic
from harnessrl.types import Episode, Task, read_jsonl

log = logging.getLogger(__name__)

FROZEN = "searcher"  # the frozen sub-agent's model name behind the gateway


def run(config: JobConfig, out: Path, progress: bool = True) -> dict:
    swarm = config.swarm
    for key, model in (("swarm.subagent_model", swarm.subagent_model), ("swarm.subagent_base", swarm.subagent_base)):
        try:  # checked before the folder holds the config: a retry with the mended name is the same run
            if model is not None:
                check_model(model)
        except SourceError as exc:
            raise ValueError(f"{key}: {exc}") from None
    if swarm.subagent_config is not None:
        JobConfig.load(swarm.subagent_config)  # a ValueError naming the file and field
    main.start_run(config, out)  # makes the sub-agent's paths absolute, so a resume from elsewhere finds them
    subagent = subagent_model(config, progress)
    return asyncio.run(_SwarmJob(config, out, progress, subagent).run())


def resume(out: Path, progress: bool = True) -> dict:
    config = JobConfig.load_run(out)
    return asyncio.run(_SwarmJob(config, out, progress, subagent_model(config, progress)).run())


def subagent_model(config: JobConfig, progress: bool) -> str:
    """The frozen sub-agent: `swarm.subagent_model`, or the best/ of a search main job, run (or finished) first."""
    swarm = config.swarm
    if swarm.subagent_model:
        return swarm.subagent_model
    best = swarm.subagent_run / "best"
    if not (swarm.subagent_run / "summary.json").is_file():  # best/ is there from the first validation on
        if progress:
            print(f"swarm: no finished search agent at {swarm.subagent_run}; training it first (the search main job, "
                  "same data and agent; a stopped one goes on)")  # fmt: skip
        main.run(search_config(config), swarm.subagent_run, progress)
    return str(best)


def search_config(config: JobConfig) -> JobConfig:
    """The main job that trains the sub-agent: `swarm.subagent_config`, or the main job's own phases and
    sizes on this job's seed, data and agent, from `swarm.subagent_base` (default: this job's model)."""
    if config.swarm.subagent_config is not None:
        search = JobConfig.load(config.swarm.subagent_config)
    else:
        keep = ("tool_format", "lora", "seed", "data", "agent", "loggers")
        search = JobConfig(model=config.swarm.subagent_base or config.model, **{k: getattr(config, k) for k in keep})
    if search.swarm is not None or search.rl.validation_tasks == 0:
        raise ValueError("swarm.subagent_config: a search main job with validation (it writes best/), not a swarm job")
    return search


def wide_splits(items, config: JobConfig) -> tuple[list[Task], list[Task], list[Task], list[Task]]:
    """(validation, demonstrated train, RL, test) wide tasks. Validation's questions are set aside first
    (whole tasks, a quarter of the train questions at most), then `swarm.rl_questions` of the rest for
    RL alone; without those RL draws from the demonstrated tasks."""
    swarm = config.swarm
    n_train = sum(t.split == "train" for t in items)
    n_validation = min(config.rl.validation_tasks, cap := n_train // 4 // swarm.width)
    if n_validation < config.rl.validation_tasks:
        log.warning(
            "rl.validation_tasks: %d asked, %d set aside (a quarter of the %d train questions, %d a task)%s",
            config.rl.validation_tasks, cap, n_train, swarm.width,
            "" if cap else ": no validation, the last update is kept",
        )  # fmt: skip
    items, held = set_aside(items, n_validation * swarm.width, config.seed)
    validation = wide_tasks(held, swarm.width, config.seed, name="validation")
    n_rl = round(swarm.rl_questions * (n_train - len(held)))
    items, rl_only = set_aside(items, n_rl, config.seed, purpose="rl")
    tasks = wide_tasks(items, swarm.width, config.seed, swarm.bundlings)
    train = [t for t in tasks if t.split == "train"]
    rl_train = wide_tasks(rl_only, swarm.width, config.seed, swarm.bundlings, name="rl") if n_rl else train
    test = [t for t in tasks if t.split == "test"][: config.eval_tasks]
    if not train or not test or not rl_train:
        raise ValueError(
            f"the wide tasks need both splits: {len(train)} train ({len(rl_train)} for RL), {len(test)} test"
        )
    return validation, train, rl_train, test


def _mean_f1(episodes: list[Episode]) -> float:
    return sum(item_f1(e) for e in episodes) / max(len(episodes), 1)


class _SwarmJob(main._Job):
    VALIDATION_METRIC = "item_f1"

    def __init__(self, config: JobConfig, out: Path, progress: bool, subagent: str):
        super().__init__(config, out, progress)
        self.subagent = subagent

    async def run(self) -> dict:
        config, out, started = self.config, self.out, time.perf_counter()
        swarm = config.swarm
        random.seed(config.seed)
        docs, items = config.data.documents()
        self.validation, train, rl_train, test = wide_splits(items, config)
        a = config.agent
        index = SearchIndex(docs, out / "index", source=str(config.data.corpus or "the synthetic corpus"))
        searcher = SearchAgent(index, a.context_budget, a.max_turns, a.k, a.max_tokens,
                               temperature=swarm.subagent_temperature)  # fmt: skip
        self.policy = Policy.load(config.model, seed=config.seed, tool_format=config.tool_format)
        frozen = Policy.load(self.subagent, tool_format=config.tool_format)
        for policy in (self.policy, frozen):  # both answer multi-turn conversations
            policy.engine.prefix_cache = config.prefix_cache
        self.lora = lora_for(self.policy.model, config.lora, config.rl.train.lora)
        pinned = Pinned(frozen, cache=swarm.subagent_cache)
        self.gateway = GatewayClient(main.ADMIN, app=create_app(self.policy, main.ADMIN, frozen={FROZEN: pinned}))
        wide = functools.partial(
            WideOrchestrator, FROZEN, searcher, swarm.limits, swarm.orchestrator_max_tokens, assign=swarm.assign
        )
        orchestrator, greedy = wide(temperature=swarm.orchestrator_temperature), wide(temperature=0.0)
        self.reward = wide_reward(swarm.lambda_parallel, swarm.lambda_finish)
        self.seconds["setup"] = self.seconds.get("setup", 0.0) + time.perf_counter() - started
        try:
            if config.sft.steps:
                demos = await self._phase("demos", lambda: self._expert(orchestrator, train))
                await self._phase("sft", lambda: self._sft(demos))
            baseline = await self._phase(
                "baseline", lambda: self._eval("baseline", SerialSearch(searcher, FROZEN), test)
            )
            # the scripted orchestrator on the same tasks: what delegation alone gives with these sub-agents
            scripted = await self._phase(
                "scripted", lambda: self._eval("scripted", OrchestratorExpert(orchestrator), test)
            )
            before = await self._phase("eval_before", lambda: self._eval("eval_before", orchestrator, test))
            greedy_before = await self._phase(
                "eval_before_greedy", lambda: self._eval("eval_before_greedy", greedy, test, repeats=1)
            )
            await self._phase("rl", lambda: self._rl(orchestrator, rl_train))
            chosen = self._load_best()
            if chosen["update"] == 0:  # validation kept the SFT weights: eval_before measured them (main.py)
                self._reuse_eval_before()
            after = await self._phase("eval_after", lambda: self._eval("eval_after", orchestrator, test))
            greedy_after = await self._phase(
                "eval_after_greedy", lambda: self._eval("eval_after_greedy", greedy, test, repeats=1)
            )
        finally:
            await self.gateway.aclose()
            self.policy.close()
            frozen.close()
        held = {w: read_jsonl(out / f"eval_{w}.jsonl", Episode) for w in ("before", "after")}
        greedy_held = {w: read_jsonl(out / f"eval_{w}_greedy.jsonl", Episode) for w in ("before", "after")}
        summary = {
            "heldout_tasks": len(test),
            "width": swarm.width,
            "subagent_model": self.subagent,
            "f1_single": baseline["f1"],
            "f1_swarm_before_rl": before["f1"],
            "f1_swarm": after["f1"],
            "f1_swarm_scripted": scripted["f1"],
            "f1_swarm_greedy_before_rl": greedy_before["f1"],
            "f1_swarm_greedy": greedy_after["f1"],
            "f1_swarm_gain_ci": gain_ci(held["before"], held["after"], item_f1),  # paired by task
            "f1_swarm_gain_ci_greedy": gain_ci(greedy_held["before"], greedy_held["after"], item_f1),
            "heldout_alarms": falling({"sampled": held, "greedy": greedy_held}, item_f1),  # item-F1
            "critical_steps_single": baseline["critical_steps"],
            "critical_steps_swarm_scripted": scripted["critical_steps"],
            "critical_steps_swarm_before_rl": before["critical_steps"],
            "critical_steps_swarm": after["critical_steps"],
            "critical_steps_swarm_greedy": greedy_after["critical_steps"],
            "critical_steps_reduction": baseline["critical_steps"] / max(after["critical_steps"], 1e-9),
            "total_steps_single": baseline["total_steps"],
            "total_steps_swarm": after["total_steps"],
            "rl_updates": self.rl_updates,
            "budget_stop": self._budget_stop(),
            "sft_plan": self._read_sft_plan(),
            "subagent_cache_hits": pinned.hits,  # sub-agent calls answered from an identical earlier one
            "chosen_update": chosen["update"],
            "validation": chosen["validation"],
            "wall_seconds": sum(self.seconds.values()),
            "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "phase_seconds": self.seconds,
        }
        write_atomic(out / "summary.json", json.dumps(summary, indent=1))
        main.warn_heldout_alarms(summary)
        if (out / "metrics.jsonl").exists():
            plot_rewards(out / "metrics.jsonl", out / "rewards.png")
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            keys = ["reward/item_f1", "swarm/spawn_rate", "swarm/finish_rate"]
            plot_curves(
                {"": rows}, keys, out / "swarm.png", "swarm: item-F1, delegation, completion by update", "share"
            )
        return summary

    async def _expert(self, orchestrator: WideOrchestrator, train) -> list[Episode]:
        path = self.out / "demos.jsonl"
        if path.is_file():
            return self._fits(read_jsonl(path, Episode))
        engine = RolloutEngine(self.gateway, OrchestratorExpert(orchestrator), self.reward,
                               RolloutConfig(group_size=2, episode_timeout=self._episode_seconds()))  # fmt: skip
        runs = [t for t in train for _ in range(self.config.sft.demos_per_task)]
        demos = [e for e in await asyncio.gather(*(engine.episode(t) for t in runs)) if e.status == "finished"]
        if not demos:
            raise RuntimeError("the scripted orchestrator finished no demonstration: see the gateway's errors above")
        main._dump(path, demos)
        return self._fits(demos)

    def _episode_seconds(self) -> float:
        """Every phase's episode timeout (demonstrations, validation, RL; the evals' per question): RL's rollout
        allowance for the orchestrator's replies, and its steps' tool calls at their longest."""
        return self.config.swarm.episode_seconds(self.config.rl.rollout.episode_timeout)

    def _fits(self, demos: list[Episode]) -> list[Episode]:
        """The demonstrations, if the policy may write replies as long as theirs (else SFT teaches cut-off calls)."""
        longest = max(len(c.completion_ids) for e in demos for c in e.calls if c.trainable)
        if longest > (limit := self.config.swarm.orchestrator_max_tokens):
            raise ValueError(
                f"swarm.orchestrator_max_tokens: {limit} is below the scripted orchestrator's longest reply "
                f"({longest} tokens, {self.out / 'demos.jsonl'}): the policy could not write what SFT teaches it"
            )
        return demos

    async def _eval(self, name: str, harness, test, repeats: int | None = None) -> dict:
        path = self.out / f"{name}.json"
        if path.is_file():
            return json.loads(path.read_text())
        tasks = [t for t in test for _ in range(repeats or self.config.eval_repeats)]
        # the baseline runs its questions one after another: its episodes get that many times as long
        timeout = self._episode_seconds() * max(len(t.data["questions"]) for t in test)
        _, episodes = await evaluate(self.gateway, harness, tasks, timeout=timeout)
        main._dump(self.out / f"{name}.jsonl", episodes)
        n, parallel = max(len(episodes), 1), self.config.swarm.limits.max_parallel
        result = {
            "f1": _mean_f1(episodes),
            "critical_steps": sum(critical_steps(e.calls, parallel) for e in episodes if e.calls) / n,
            "total_steps": sum(len(e.calls) for e in episodes) / n,
            "failed": sum(e.status == "failed" for e in episodes),
            **{
                k.removeprefix("swarm/"): v
                for k, v in swarm_metrics(episodes, parallel=parallel).items()
                if "lambda" not in k
            },
            "episodes": len(episodes),
            "policy_version": self.policy.version,
        }
        write_atomic(path, json.dumps(result, indent=1))
        return result

    async def _validation_scores(self, harness, tasks) -> dict[str, list[float]]:
        _, episodes = await evaluate(self.gateway, harness, tasks, timeout=self._episode_seconds())
        return scores_by_task(episodes, item_f1)

    async def _rl(self, orchestrator: WideOrchestrator, train) -> None:
        cfg = self.config.rl
        alarms = SwarmAlarms()

        def batch_metrics(episodes: list[Episode], step: int) -> dict[str, float]:
            metrics = swarm_metrics(episodes, self.reward, step, self.config.swarm.limits.max_parallel)
            return metrics | alarms.update(metrics)

        rollout = cfg.rollout.model_copy(update={"episode_timeout": self._episode_seconds()})
        await self._run_rl(orchestrator, self.reward, train, rollout, batch_metrics)
