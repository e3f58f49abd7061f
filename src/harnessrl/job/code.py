"""The coding job: the coding agent (envs/code) learns to fix bugs judged by hidden tests.

tasks (a folder of task folders, or generated from the curated library and cached in
`$HARNESSRL_CACHE/code-tasks/`) -> the scripted expert's demonstrations -> SFT -> held-out eval
(functions never trained on) -> RL with the code reward, `code/*` metrics (hidden-test pass share,
cheat rate on the impossible tasks, submit rate) and `hacking/<flag>` per update -> held-out eval.
The last RL weights are kept.

Run folder: config.yaml, tasks.json (which tasks, their statistics), demos.jsonl, sft/,
eval_before.json / .jsonl, metrics.jsonl and checkpoints/ (RL), eval_after.json / .jsonl,
phases.json, rewards.png, summary.json. `resume` skips finished phases, as the main job's does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import random
import resource
import time
from pathlib import Path

from harnessrl.envs.code import sandbox
from harnessrl.envs.code.expert import CodeExpert
from harnessrl.envs.code.generate import LIBRARY, generate, statistics
from harnessrl.envs.code.harness import CodingAgent
from harnessrl.envs.code.reward import cheat_rate, code_reward, hidden_tests
from harnessrl.envs.code.tasks import CodeTask, load_tasks
from harnessrl.eval.evaluate import falling, gain_ci, worse
from harnessrl.eval.heldout import evaluate
from harnessrl.eval.plots import plot_rewards
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.job import main
from harnessrl.job.config import JobConfig
from harnessrl.policy import Policy
from harnessrl.policy.sources import cache_dir
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.train import lora_for
from harnessrl.train.checkpoint import write_atomic
from harnessrl.types import Episode, Task, read_jsonl

log = logging.getLogger(__name__)


def run(config: JobConfig, out: Path, progress: bool = True) -> dict:
    main.start_run(config, out)
    return asyncio.run(_CodeJob(config, out, progress).run())


def resume(out: Path, progress: bool = True) -> dict:
    return asyncio.run(_CodeJob(JobConfig.load_run(out), out, progress).run())


def task_folder(config: JobConfig, progress: bool) -> Path:
    """`code.tasks`, or the curated library's tasks generated once per library and settings (cached)."""
    code = config.code
    if code.tasks is not None:
        return code.tasks
    digest = hashlib.sha256()
    for path in generator_sources():
        digest.update(path.read_bytes())
    digest.update(f"{config.seed}:{code.per_function}:{code.pairs}:{code.impossible_share}".encode())
    folder = cache_dir() / "code-tasks" / digest.hexdigest()[:16]
    if not (folder / "stats.json").is_file():  # written last: a half-generated folder is generated again
        generate(folder, seed=config.seed, per_function=code.per_function, pairs=code.pairs,
                 impossible_share=code.impossible_share, progress=progress)  # fmt: skip
    return folder


def generator_sources() -> list[Path]:
    """What the generated tasks depend on: the library, the generator, and the scoring path its validation runs."""
    here = Path(sandbox.__file__).parent
    return [
        *sorted(LIBRARY.rglob("*.py")),
        *(here / name for name in ("generate.py", "score.py", "sandbox.py", "tasks.py")),
    ]


def heldout_sample(loaded: list[tuple[CodeTask, Path]], n: int | None, seed: int) -> list[tuple[CodeTask, Path]]:
    """`n` of the test split's tasks, spread across functions: round-robin over the functions in a seeded order
    (each function's tasks shuffled), the impossible tasks apart so that they keep their share of the split (at
    least one where there are any and `n` > 1: a single task is a possible one, so that solving is measured). A
    user's task without `source.function` is a function of its own."""
    rng = random.Random(seed)
    test = [(spec, path) for spec, path in loaded if spec.split == "test"]
    n = len(test) if n is None else min(n, len(test))  # eval_tasks None: all of them
    impossible = [(spec, path) for spec, path in test if spec.impossible]
    share = round(n * len(impossible) / max(len(test), 1))
    if impossible and n > 1:  # at least one, so that `cheat_rate` is measured
        share = max(share, 1)
    picked = _round_robin(impossible, min(share, n), rng)
    return picked + _round_robin([(s, p) for s, p in test if not s.impossible], n - len(picked), rng)


def _round_robin(tasks: list[tuple[CodeTask, Path]], n: int, rng: random.Random) -> list[tuple[CodeTask, Path]]:
    by_function: dict[tuple, list] = {}
    for spec, path in tasks:
        function = (spec.source.get("module"), spec.source.get("function", spec.id))
        by_function.setdefault(function, []).append((spec, path))
    queues = list(by_function.values())
    rng.shuffle(queues)
    for queue in queues:
        rng.shuffle(queue)
    picked = []
    while len(picked) < n and any(queues):
        picked += [queue.pop() for queue in queues if queue][: n - len(picked)]
    return picked


def code_metrics(episodes: list[Episode]) -> dict[str, float]:
    """`code/*` of a batch: hidden-test pass share, solved, cheat rate on impossible tasks, submitted, dropped edits."""
    n = max(len(episodes), 1)
    info = [e.outcome.info if e.outcome else {} for e in episodes]
    return {
        "code/hidden_tests": sum(hidden_tests(e) for e in episodes) / n,
        "code/solved": sum(e.succeeded for e in episodes) / n,
        "code/cheat_rate": cheat_rate(episodes),
        "code/submitted": sum(bool(i.get("submitted")) for i in info) / n,
        "code/dropped_test_edits": sum(bool(i.get("dropped")) for i in info) / n,
        "code/summaries": sum(i.get("summaries", 0) for i in info) / n,
    }


def heldout_alarms(held: dict[str, list[Episode]]) -> list[str]:
    """What RL made worse on the held-out tasks beyond noise (`worse`, a permutation test paired by task, as
    the main job's): `sampled_falling` (solved) and `hidden_tests_falling` (the share of hidden tests passed),
    both of the possible tasks, so that a cheat cannot hide them, and `cheat_rising` (impossible tasks whose
    hidden tests all passed: only a cheat can)."""
    impossible = {when: [e for e in eps if e.task.data.get("impossible")] for when, eps in held.items()}
    possible = {when: [e for e in eps if not e.task.data.get("impossible")] for when, eps in held.items()}
    alarms = falling({"sampled": possible}) + falling({"hidden_tests": possible}, hidden_tests)
    if worse(impossible["before"], impossible["after"], sign=-1):
        alarms.append("cheat_rising")
    return alarms


def solved_demonstrations(episodes: list[Episode]) -> list[Episode]:
    """The expert's episodes that solved their task: SFT on one that raised, or whose fix did not pass the hidden
    tests (an edit refused, a reference that fails), would teach its mistakes. How many were left out, and why, is
    logged."""
    failed = [e for e in episodes if e.status != "finished"]
    unsolved = [e for e in episodes if e.status == "finished" and not e.succeeded]
    if failed or unsolved:
        first = [f"{e.task.id}: {e.failure_reason}" for e in failed[:1]]
        first += [
            f"{e.task.id}: hidden tests {(e.outcome.info if e.outcome else {}).get('hidden')}" for e in unsolved[:1]
        ]
        log.warning(
            "%d of %d demonstrations are left out of SFT: %d failed, %d did not solve their task; the first: %s",
            len(failed) + len(unsolved), len(episodes), len(failed), len(unsolved), "; ".join(first),
        )  # fmt: skip
    return [e for e in episodes if e.status == "finished" and e.succeeded]


class _CodeJob(main._Job):
    async def run(self) -> dict:
        config, out, started = self.config, self.out, time.perf_counter()
        code = config.code
        guards = sandbox.run(["true"], out).guards
        open_guards = [name for name in ("writes", "reads") if guards[name] == "off"]
        if open_guards and not code.unsandboxed:
            raise ValueError(
                f"the sandbox's {' and '.join(open_guards)} guard is off on this machine ({guards}): the agent's code "
                "could read the hidden tests and rewrite the cached tasks, so rewards could be forged. Install "
                "bubblewrap (docs/code.md), or set code.unsandboxed: true to train anyway"
            )
        random.seed(config.seed)
        folder = task_folder(config, self.progress)
        loaded = load_tasks(folder)
        written = folder / "stats.json"  # the generator's, with its candidates and rejections
        stats = json.loads(written.read_text()) if written.is_file() else statistics([t for t, _ in loaded])
        train = [spec.task(path) for spec, path in loaded if spec.split != "test"]
        test = [spec.task(path) for spec, path in heldout_sample(loaded, config.eval_tasks, config.seed)]
        if not train or not test:
            raise ValueError(f"{folder}: the tasks need both splits: {len(train)} train, {len(test)} test")
        write_atomic(out / "tasks.json", json.dumps({"folder": str(folder), "stats": stats}, indent=1))
        limits = sandbox.Limits(
            wall_seconds=code.test_seconds, cpu_seconds=math.ceil(code.test_seconds), workspace_mb=sandbox.WORKSPACE_MB
        )
        self.agent = CodingAgent(code.max_turns, code.max_tokens, 1.0, code.summarise_at, code.summary_tokens, limits)
        self.policy = Policy.load(config.model, seed=config.seed, tool_format=config.tool_format)
        self.lora = lora_for(self.policy.model, config.lora, config.rl.train.lora)
        self.policy.engine.prefill_share = None
        self.policy.engine.prefix_cache = config.prefix_cache
        self.gateway = GatewayClient(main.ADMIN, app=create_app(self.policy, main.ADMIN))
        self.reward = code_reward()
        self.seconds["setup"] = self.seconds.get("setup", 0.0) + time.perf_counter() - started
        try:
            if config.sft.steps:
                demos = await self._phase("demos", lambda: self._expert(train))
                await self._phase("sft", lambda: self._sft(demos))
            before = await self._phase("eval_before", lambda: self._eval("eval_before", test))
            await self._phase("rl", lambda: self._rl(train))
            after = await self._phase("eval_after", lambda: self._eval("eval_after", test))
        finally:
            await self.gateway.aclose()
            self.policy.close()
        held = {when: read_jsonl(out / f"eval_{when}.jsonl", Episode) for when in ("before", "after")}
        summary = {
            "heldout_tasks": len(test),
            "heldout_success_before": before["solved"],
            "heldout_success_after": after["solved"],
            "heldout_gain_ci": gain_ci(held["before"], held["after"]),
            "heldout_alarms": heldout_alarms(held),
            "heldout_hidden_tests_before": before["hidden_tests"],
            "heldout_hidden_tests_after": after["hidden_tests"],
            "cheat_rate_before": before["cheat_rate"],
            "cheat_rate_after": after["cheat_rate"],
            "submitted_before": before["submitted"],
            "submitted_after": after["submitted"],
            "tasks": stats,
            "sandbox_guards": guards,
            "rl_updates": self.rl_updates,
            "budget_stop": self._budget_stop(),
            "sft_plan": self._read_sft_plan(),
            "wall_seconds": sum(self.seconds.values()),
            "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "phase_seconds": self.seconds,
        }
        write_atomic(out / "summary.json", json.dumps(summary, indent=1))
        main.warn_heldout_alarms(summary)
        if (out / "metrics.jsonl").exists():
            plot_rewards(out / "metrics.jsonl", out / "rewards.png")
        return summary

    async def _expert(self, train: list[Task]) -> list[Episode]:
        path = self.out / "demos.jsonl"
        if path.is_file():
            return read_jsonl(path, Episode)
        solvable = [
            t for t in train if not t.data.get("impossible") and (Path(t.data["task_dir"]) / "reference").is_dir()
        ]
        if not solvable:
            raise ValueError("no training task has a reference/ fix for the expert's demonstrations: set sft.steps: 0")
        episodes = []
        for rep in range(self.config.sft.demos_per_task):
            engine = RolloutEngine(self.gateway, CodeExpert(self.agent, seed=self.config.seed * 1000 + rep),
                                   self.reward, RolloutConfig(group_size=2, concurrency=2))  # fmt: skip
            episodes += await asyncio.gather(*(engine.episode(t) for t in solvable))
        demos = solved_demonstrations(episodes)
        if not demos:
            raise RuntimeError("the scripted expert solved no task: see the warning above")
        main._dump(path, demos)
        return demos

    async def _eval(self, name: str, test: list[Task]) -> dict:
        path = self.out / f"{name}.json"
        if path.is_file():
            return json.loads(path.read_text())
        tasks = [t for t in test for _ in range(self.config.eval_repeats)]
        _, episodes = await evaluate(self.gateway, self.agent, tasks, concurrency=4, timeout=self._episode_seconds())
        main._dump(self.out / f"{name}.jsonl", episodes)
        result = {k.removeprefix("code/"): v for k, v in code_metrics(episodes).items()}
        result |= {"episodes": len(episodes), "failed": sum(e.status == "failed" for e in episodes),
                   "policy_version": self.policy.version}  # fmt: skip
        write_atomic(path, json.dumps(result, indent=1))  # a half-written one would stop `resume`
        return result

    def _episode_seconds(self) -> float:
        """Each turn may run the tests once, and scoring runs them once more."""
        return (self.config.code.max_turns + 1) * (self.config.code.test_seconds + 30)

    async def _rl(self, train: list[Task]) -> None:
        cfg = self.config.rl
        timeout = max(cfg.rollout.episode_timeout, self._episode_seconds())
        rollout = cfg.rollout.model_copy(
            update={"episode_timeout": timeout, "concurrency": min(cfg.rollout.concurrency, 8)}
        )
        await self._run_rl(self.agent, self.reward, train, rollout, lambda episodes, _: code_metrics(episodes))
