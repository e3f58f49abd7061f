"""PARL (Kimi K2.5 Agent Swarm): r_perf + lambda_parallel(t) r_parallel + lambda_finish(t) r_finish, and its alarms.

r_parallel (instantiation) pays for assigning sub-agent work at all, against serial collapse
(an orchestrator that stops delegating because sub-agent feedback is sparse); r_finish (the share
of assigned runs that finished) against spawn farming (many useless sub-agents). Kimi does not
publish either closed form; ours: r_parallel = min(distinct, cap) / cap and r_finish =
distinct_finished / assigned (0 when nothing was assigned), where `distinct` counts assignments of different
task text: padding with repeats of one easy task raises neither (a repeat lowers r_finish as an unfinished run
would). Both weights anneal to 0 (`anneal_to_zero`), so
late in training only the outcome pays; a third-party reproduction whose lambda never annealed
farmed spawns while F1 fell. Terms read the swarm summary a harness puts in
`outcome.info["swarm"]` (`harness/swarm.py`); critical steps come from the recorded call tree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from harnessrl.calltree import critical_steps, lineages
from harnessrl.rewards.compose import Reward, Term
from harnessrl.rewards.schedules import Schedule, anneal_to_zero
from harnessrl.types import Episode

log = logging.getLogger(__name__)


def swarm_summary(episode: Episode) -> dict:
    return (episode.outcome.info.get("swarm") if episode.outcome else None) or {}


def _counted(episode: Episode) -> dict:
    """The summary the metrics count. A failed episode (a timeout, a raising harness) never wrote its outcome, so has
    no summary: its runs are read from its call tree (the lineages its root lineages' calls spawned), none finished
    (their outputs went down with it). Counted as nothing, it would read as "did not delegate" and fake a serial
    collapse."""
    if episode.status != "failed":
        return swarm_summary(episode)
    tree = lineages(episode.calls)
    roots = {c for t in tree if t.parent_call is None for c in t.calls}
    return {"assigned": sum(t.parent_call in roots for t in tree), "finished": 0}


def r_parallel(episode: Episode, cap: int = 4) -> float:
    summary = swarm_summary(episode)
    return min(summary.get("distinct", summary.get("assigned", 0)), cap) / cap


def r_finish(episode: Episode) -> float:
    summary = swarm_summary(episode)  # a summary written before `distinct` existed counts every run
    finished = summary.get("distinct_finished", summary.get("finished", 0))
    return finished / summary["assigned"] if summary.get("assigned") else 0.0


def parl_reward(
    perf: Term,
    lambda_parallel: Schedule | None = None,
    lambda_finish: Schedule | None = None,
    cap: int = 4,
) -> Reward:
    """`perf` (the task's outcome term) plus the two annealed auxiliary terms, named `parallel` and `finish`."""
    return Reward([
        perf,
        Term("parallel", lambda e: r_parallel(e, cap), lambda_parallel or anneal_to_zero(0.1, 100)),
        Term("finish", r_finish, lambda_finish or anneal_to_zero(0.1, 100)),
    ])  # fmt: skip


def swarm_metrics(
    episodes: list[Episode], reward: Reward | None = None, step: int = 0, parallel: int | None = None
) -> dict[str, float]:
    """`swarm/*` metrics of a batch: spawn_rate (share of episodes that assigned sub-agent work),
    assigned, unfinished and repeated (runs beyond the distinct task texts) per episode, finish_rate (over all
    runs), critical (`parallel` sub-agents at once at most) and total steps per episode, failed_rate (share of
    failed episodes, counted from their call trees: `_counted`), and the lambdas at `step`."""
    summaries = [_counted(e) for e in episodes]
    assigned = [s.get("assigned", 0) for s in summaries]
    finished = [s.get("finished", 0) for s in summaries]
    n = max(len(episodes), 1)
    metrics = {
        "swarm/spawn_rate": sum(a > 0 for a in assigned) / n,
        "swarm/assigned": sum(assigned) / n,
        "swarm/unfinished": (sum(assigned) - sum(finished)) / n,
        "swarm/repeated": sum(a - s.get("distinct", a) for a, s in zip(assigned, summaries)) / n,
        "swarm/finish_rate": sum(finished) / sum(assigned) if sum(assigned) else 0.0,
        "swarm/critical_steps": sum(critical_steps(e.calls, parallel) for e in episodes if e.calls) / n,
        "swarm/total_steps": sum(len(e.calls) for e in episodes) / n,
        "swarm/failed_rate": sum(e.status == "failed" for e in episodes) / n,
    }
    terms = {t.name: t for t in reward.terms} if reward else {}
    for name in ("parallel", "finish"):
        if name in terms:
            metrics[f"swarm/lambda_{name}"] = terms[name].weight_at(step)
    return metrics


@dataclass
class SwarmAlarms:
    """Trips on the two PARL failure modes, from the `swarm/*` metrics of successive updates.

    serial collapse: spawn_rate was at least `active` once and has stayed at or below `collapsed`
    for `patience` updates. spawn farming: unfinished runs per episode, averaged over the last
    `patience` updates, reached `rise` times their average over the first `patience` updates
    (and at least `min_unfinished`). Each alarm fires once, is logged as a warning and returned."""

    active: float = 0.5
    collapsed: float = 0.05
    rise: float = 2.0
    min_unfinished: float = 1.0
    patience: int = 3
    history: list[dict[str, float]] = field(default_factory=list)
    fired: set[str] = field(default_factory=set)

    def update(self, metrics: dict[str, float]) -> dict[str, float]:
        """Record one update's metrics; `alarm/serial_collapse` and `alarm/spawn_farming` as 0/1."""
        self.history.append(metrics)
        spawn = [m["swarm/spawn_rate"] for m in self.history]
        unfinished = [m["swarm/unfinished"] for m in self.history]
        k = self.patience
        now = {
            "serial_collapse": max(spawn) >= self.active
            and len(spawn) >= k
            and all(s <= self.collapsed for s in spawn[-k:]),
            "spawn_farming": len(unfinished) >= 2 * k
            and (late := sum(unfinished[-k:]) / k) >= self.min_unfinished
            and late >= self.rise * sum(unfinished[:k]) / k,
        }
        for name, on in now.items():
            if on and name not in self.fired:
                self.fired.add(name)
                log.warning("swarm alarm: %s at update %d (%s)", name, len(self.history), _WHY[name])
        return {f"alarm/{name}": float(on) for name, on in now.items()}


_WHY = {
    "serial_collapse": "the orchestrator stopped delegating; keep r_parallel longer or budget on critical steps",
    "spawn_farming": "unfinished sub-agent runs are rising; weight r_finish or anneal lambda_parallel sooner",
}
