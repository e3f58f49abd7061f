"""One production training cycle: traffic since the last cycle -> reward -> candidate -> gate -> decision.

    harnessrl cycle loop.yaml --once | --every 5h

1. the window: episodes that ended (finished, failed, expired) since the previous cycle's window
   ended, up to `feedback_wait` seconds ago (late feedback has that long after an episode ends);
   sessions idle past the TTL are expired first; sessions still running join the window they end in;
2. reward from feedback (loop/feedback.py); unlabelled, failed and expired episodes are counted, and
   the sessions still running (`unfinished`);
3. episodes some of whose calls another version sampled are refused (`stale: refuse`) or kept
   (`stale: correct`: the loss's importance ratio against the recorded sampled logprobs corrects
   them), and their share is reported;
4. a candidate trained from the promoted version: `epochs` passes over the labelled episodes in
   shuffled chunks of about `batch_episodes`, one policy-gradient step each (the advantage's
   baseline is the chunk's mean reward: production traffic has no groups of one task);
5. the gate (loop/gate.py) on the domain benchmark; the candidate becomes version N+1 with its
   figures and decision, and is promoted when the gate passes.

Every cycle, run or skipped, appends one `cycle` line to the registry's events.jsonl. A crash
before its version is renamed into place leaves the window unconsumed and PROMOTED unchanged: the
next cycle redoes it. A crash after that is completed by the next cycle (`complete_interrupted`):
the version's cycle line written from its version.json, its promotion made if its gate passed.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import logging
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from harnessrl.gateway.serving import EXPIRED
from harnessrl.loop.feedback import FeedbackMap, feedback_reward
from harnessrl.loop.gate import GateConfig, decide, run_benchmark
from harnessrl.loop.registry import Registry, RegistryError, VersionInfo
from harnessrl.loop.store import Store
from harnessrl.policy import Policy
from harnessrl.policy.model import load_model_and_tokenizer
from harnessrl.train import TrainConfig, Trainer, lora_for
from harnessrl.types import Episode, Task, read_jsonl, read_yaml, validated

log = logging.getLogger(__name__)


class BenchmarkConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tasks: Path = Field(description="Task JSONL: the held-out items candidate and current both run")
    score: str = Field(description="MODULE:FUNCTION, (Episode) -> float in [0, 1]: the preference metric")


class LoopConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    registry: Path = Field(description="the registry folder (harnessrl registry DIR --create NAME --model M)")
    store: str | None = Field(default=None, description="SQLAlchemy URL or SQLite path; default REGISTRY/traces.db")
    harness: str = Field(description="MODULE:FUNCTION, async (task, llm) -> Outcome: the agent the benchmark runs")
    benchmark: BenchmarkConfig
    feedback: FeedbackMap = Field(default_factory=FeedbackMap)
    gate: GateConfig = Field(default_factory=GateConfig)
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(lr=1e-4))
    batch_episodes: int = Field(default=32, ge=2, description="labelled episodes per policy-gradient step")
    epochs: int = Field(default=1, ge=1, description="passes over the window's episodes")
    min_episodes: int = Field(default=16, ge=2, description="fewer labelled episodes: the cycle is skipped")
    stale: Literal["refuse", "correct"] = Field(
        default="refuse", description="episodes sampled by another version: refused, or importance-corrected"
    )
    feedback_wait: float = Field(default=600.0, ge=0, description="seconds late feedback has before a window closes")
    session_ttl: float = Field(default=3600.0, gt=0, description="idle seconds before a session is expired")
    _base: Path = PrivateAttr(default_factory=Path.cwd)  # the config's folder: relative paths and imports

    @classmethod
    def load(cls, path: Path) -> LoopConfig:
        try:
            data = read_yaml(path) or {}  # not YAML: a ValueError naming the file and line
        except OSError as exc:
            raise ValueError(f"{path}: {exc}") from None
        config = validated(cls, data, path)
        base = Path(path).resolve().parent  # relative paths are the config's
        config.registry = base / config.registry
        config.benchmark.tasks = base / config.benchmark.tasks
        if config.store is None:
            config.store = str(config.registry / "traces.db")
        elif "://" not in config.store:
            config.store = str(base / config.store)
        config._base = base
        try:  # a wrong folder fails now, not at every period of `--every`
            Registry(config.registry)
        except RegistryError as exc:
            raise ValueError(f"{path}: registry: {exc}") from None
        try:  # what a cycle reads only once traffic is labelled: checked now, not days later
            items = read_jsonl(config.benchmark.tasks, Task)
        except (OSError, ValueError) as exc:  # ValueError: TraceLineError, naming the line
            raise ValueError(f"{path}: benchmark.tasks: {exc}") from None
        ids = [t.id for t in items]  # the gate pairs its two sides by item id
        if repeated := sorted({i for i in ids if ids.count(i) > 1}):
            raise ValueError(f"{path}: benchmark.tasks: {config.benchmark.tasks}: task ids used twice: {repeated[:5]}")
        for field, spec in (("harness", config.harness), ("benchmark.score", config.benchmark.score)):
            try:
                config.imported(spec)
            except ValueError as exc:
                raise ValueError(f"{path}: {field}: {exc}") from None
        return config

    def imported(self, spec: str):
        """MODULE:NAME (importable from the config's folder too) or FILE.py:NAME (relative to the config)."""
        module, _, name = spec.partition(":")
        try:
            if module.endswith(".py"):
                return getattr(_file_module((self._base / module).resolve()), name)
            if str(self._base) not in sys.path:
                sys.path.insert(0, str(self._base))
            return getattr(importlib.import_module(module), name)
        except Exception as exc:  # the user's module: not found, not valid Python, or failing as it runs
            raise ValueError(f"{spec!r}: {type(exc).__name__}: {exc}") from None


def _file_module(path: Path):
    """A FILE.py run once per process and version of the file, registered in sys.modules (dataclasses and pickling
    look a class's module up there): the harness and the score of one file share one module and its state, cycle
    after cycle, and an edited file is run again at the next cycle."""
    if not path.is_file():
        raise ImportError(f"no file {path}")
    name = "harnessrl_file_" + hashlib.sha256(f"{path}:{path.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    loaded = importlib.util.spec_from_file_location(name, path)
    if loaded is None:
        raise ImportError(f"no file {path}")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # its own imports of neighbours
    module = sys.modules[name] = importlib.util.module_from_spec(loaded)
    try:
        loaded.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a file that failed may be mended and loaded again
        raise
    return module


def window_start(registry: Registry) -> float:
    """Where the previous consumed window ended (0: the registry's first cycle)."""
    ends = [e["data_window"]["until"] for e in registry.events() if e["event"] == "cycle" and e.get("data_window")]
    return max(ends, default=0.0)


def run_cycle(config: LoopConfig, candidate_folder: Path | None = None, now: float | None = None) -> dict:
    """One cycle; returns its event (also appended to events.jsonl). `candidate_folder`: gate a
    candidate trained elsewhere instead of training one (a Hugging Face folder)."""
    registry = Registry(config.registry)
    with registry.lock(".cycle-lock"):  # one cycle at a time; promote / rollback stay free meanwhile
        with registry.lock():
            cleaned = registry.clean_staging()
            completed = complete_interrupted(registry)
            current = registry.promoted()
        if current is None:
            raise ValueError(f"{registry.root}: nothing promoted yet (harnessrl promote VERSION)")
        number = registry.info(current).number
        store = Store(config.store)
        try:
            event = _cycle(config, registry, store, current, number, candidate_folder, now or time.time())
        finally:
            store.close()
        event["cleaned_staging"], event["completed"] = cleaned, completed
        with registry.lock():
            if event["decision"].get("promote") and registry.promoted() != current:  # promoted by hand meanwhile
                event["decision"]["promote"] = False
                event["decision"]["reasons"].append(f"PROMOTED moved to {registry.promoted()} during the cycle")
            registry.log("cycle", **event)
            if event["decision"].get("promote"):
                registry.promote(event["version"], reason="gate passed", cycle=True)
        return event


def complete_interrupted(registry: Registry) -> list[str]:
    """Finish what a cycle killed after writing its version left undone, from the registry's own files
    (call holding the lock): a version no `cycle` line names gets its line, made from its version.json
    (its window is consumed, not trained on twice; its promotion refused, as a live cycle's would be,
    where PROMOTED no longer names its parent), and the last cycle whose gate passed gets its
    promotion where no promotion or rollback came after its line and PROMOTED still names its
    parent. Returns what was done, in words."""
    done = []
    logged = {e.get("version") for e in registry.events() if e["event"] == "cycle"}
    for info in registry.versions():
        if info.parent is not None and info.id not in logged:  # made by a cycle (a hand-added version has no parent)
            decision = dict(info.decision)
            if decision.get("promote") and registry.promoted() != info.parent:
                moved = f"PROMOTED moved to {registry.promoted()} before its cycle was completed"
                decision = decision | {"promote": False, "reasons": [*decision.get("reasons", []), moved]}
            registry.log(
                "cycle", version=info.id, parent=info.parent, data_window=info.data_window, figures=info.figures,
                decision=decision, recovered=True,
            )  # fmt: skip
            done.append(f"logged the cycle of {info.id}")
    events = registry.events()
    cycles = [i for i, e in enumerate(events) if e["event"] == "cycle" and e.get("version")]
    if cycles:
        last, after = events[cycles[-1]], events[cycles[-1] + 1 :]
        switched = any(e["event"] in ("promote", "rollback") for e in after)
        if last["decision"].get("promote") and not switched and registry.promoted() == last["parent"]:
            registry.promote(last["version"], reason="gate passed (its cycle was killed before promoting)", cycle=True)
            done.append(f"promoted {last['version']}")
    return done


def collect(config: LoopConfig, store: Store, model: str, number: int, since: float, until: float):
    """The window's episodes as (labelled episodes with their reward, counts): every episode that ended
    in the window is counted once as used, unlabelled, stale-refused, expired or failed; `unfinished`:
    the sessions still running, which join the window they end in."""
    unreadable: list[str] = []  # stored episodes that are no valid Episode: counted and named, never trained on
    rows = store.episodes(since, until, model=model, ended=True, unreadable=unreadable)
    for message in unreadable:
        log.warning("cycle %d: left out %s", number, message)
    counts = {
        "episodes": len(rows) + len(unreadable),
        "unreadable": len(unreadable),
        "expired": sum(r.episode.failure_reason == EXPIRED for r in rows),
        "unfinished": store.running(model),  # not in the window: each joins the window it ends in
        "failed": sum(r.episode.status == "failed" and r.episode.failure_reason != EXPIRED for r in rows),
        "finished": sum(r.episode.status == "finished" for r in rows),
        "unlabelled": 0,
        "stale": 0,
    }
    labelled: list[Episode] = []
    for row in rows:
        if row.episode.status != "finished":
            continue
        reward = feedback_reward(row, config.feedback)
        if reward is None:
            counts["unlabelled"] += 1
            continue
        if {c.policy_version for c in row.episode.calls if c.trainable} - {number}:  # sampled by another version
            counts["stale"] += 1
            if config.stale == "refuse":
                continue
        labelled.append(row.episode.model_copy(update={"reward": reward}))
    counts["labelled_used"] = len(labelled)
    counts["off_policy_share"] = round(counts["stale"] / max(counts["finished"] - counts["unlabelled"], 1), 4)
    return labelled, counts


def _cycle(config, registry, store, current, number, candidate_folder, now) -> dict:
    # the window and its reward
    since, until = window_start(registry), now - config.feedback_wait
    expired_now = len(store.expire(config.session_ttl, registry.name, now))
    labelled, counts = collect(config, store, registry.name, number, since, until)
    counts["expired_this_cycle"] = expired_now
    rewards = [e.reward.total for e in labelled]
    figures = {
        "counts": counts,
        "reward_mean": round(sum(rewards) / len(rewards), 4) if rewards else None,
        "feedback_map": config.feedback.version,
        "stale_policy": config.stale,
    }
    window = {"since": since, "until": until}
    if candidate_folder is None and len(labelled) < config.min_episodes:  # the window stays open for the next cycle
        decision = {"promote": False, "skipped": True, "reasons": [f"{len(labelled)} labelled < {config.min_episodes}"]}
        return {"version": None, "parent": current, "data_window": None, "figures": figures, "decision": decision}
    # the candidate
    harness, score = config.imported(config.harness), config.imported(config.benchmark.score)
    items = read_jsonl(config.benchmark.tasks, Task)
    started = time.perf_counter()
    candidate = registry.load(current) if candidate_folder is None else _external(registry, candidate_folder)
    trainer = None
    try:
        if candidate_folder is None:
            trainer, train_metrics = _train(candidate, labelled, config)
            figures["train"] = train_metrics
        figures["train_seconds"] = round(time.perf_counter() - started, 1)
        baseline = registry.load(current)
        try:
            sides = asyncio.run(_both(candidate, baseline, harness, items, score, config))
        finally:
            baseline.close()
    finally:
        candidate.close()
    decision = decide(*sides, config.gate)
    figures["eval_seconds"] = round(time.perf_counter() - started - figures["train_seconds"], 1)
    with registry.lock():
        next_number = registry.next_number()
        info = VersionInfo(
            id=f"{registry.name}@v{next_number}",
            number=next_number,
            parent=current,
            source=str(candidate_folder) if candidate_folder else None,
            data_window=window if candidate_folder is None else None,
            figures=figures,
            decision=decision,
        )
        registry.add(trainer.write_model if trainer else _copier(candidate_folder), info)
    consumed = window if candidate_folder is None else None
    return {"version": info.id, "parent": current, "data_window": consumed, "figures": figures, "decision": decision}


def _train(policy: Policy, episodes: list[Episode], config: LoopConfig) -> tuple[Trainer, list[dict]]:
    train = config.train.model_copy(update={"lora": config.train.lora or lora_for(policy.model)})
    trainer = Trainer(policy.model, policy.tokenizer, train, policy=policy)
    rng = random.Random(train.seed)
    steps = max(1, round(len(episodes) / config.batch_episodes))  # equal chunks of about batch_episodes
    metrics = []
    for _ in range(config.epochs):
        order = episodes[:]
        rng.shuffle(order)
        for chunk in (order[i::steps] for i in range(steps)):
            m = trainer.rl_step([chunk])
            metrics.append({k: round(v, 4) for k, v in m.items() if k.startswith(("loss/", "reward/", "rollout/"))})
    return trainer, metrics


async def _both(candidate, current, harness, items, score, config):
    """Candidate first, then current, on the same items (one at a time: two CPU-bound models at once only contend)."""
    cand = await run_benchmark(candidate, harness, items, score, config.gate)
    cur = await run_benchmark(current, harness, items, score, config.gate)
    return cand, cur


def _external(registry: Registry, folder: Path) -> Policy:
    try:
        return Policy(*load_model_and_tokenizer(str(folder)), registry.name)
    except ValueError as exc:  # the loader names the flag it knows, --model
        raise ValueError(str(exc).replace(f"--model {folder}", f"--candidate {folder}", 1)) from None


def _copier(folder: Path):
    """Write a candidate trained elsewhere into the staging folder (its own version.json, if any, is not ours)."""
    return lambda target: shutil.copytree(
        folder, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("version.json")
    )
