"""The eval gate: candidate and current on the same benchmark items, a paired lower bound, and canaries.

Both policies run the user's harness on every item of the domain benchmark (`repeats` episodes
each, in process, through the same gateway code as production) and are scored by the benchmark's
score function. The gate promotes only when

- the lower confidence bound of the mean paired difference (candidate - current, per item) is
  above `-margin` (a percentile bootstrap over items, fixed seed: no normality assumption), and
- the candidate finished at least `min_finished` of its episodes (a failed or timed-out episode scores 0 on both
  sides: two versions that both fail everything would otherwise tie above the bound), and
- every canary holds: tool-call validity does not drop by more than `validity_drop`, the
  clarifying-question rate does not rise by more than `clarifying_rise`, the share of failed episodes does not rise
  by more than `failure_rise`, and the mean response length stays within a factor `length_ratio` of the current
  version's.
"""

from __future__ import annotations

import numbers
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.eval.heldout import evaluate
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.harness import Harness
from harnessrl.policy import Policy
from harnessrl.rewards.detectors import clarifying_question
from harnessrl.types import Episode, Task

_KEY = "gate-admin-key-local"


class GateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    margin: float = Field(default=0.02, ge=0, description="promote when the paired lower bound is above -margin")
    confidence: float = Field(default=0.9, gt=0.5, lt=1, description="one-sided confidence of the lower bound")
    repeats: int = Field(default=4, ge=1, description="episodes per benchmark item and policy")
    validity_drop: float = Field(default=0.05, ge=0, description="largest allowed drop in tool-call validity")
    clarifying_rise: float = Field(default=0.05, ge=0, description="largest allowed rise in clarifying-question rate")
    length_ratio: float = Field(default=2.0, gt=1, description="mean response length within this factor of current's")
    failure_rise: float = Field(default=0.05, ge=0, description="largest allowed rise in the share of failed episodes")
    min_finished: float = Field(
        default=0.5, ge=0, le=1, description="the candidate must finish at least this share of its episodes"
    )
    timeout: float = Field(default=120.0, gt=0, description="seconds one benchmark episode may take (then it failed)")
    concurrency: int = Field(default=32, ge=1, description="benchmark episodes in flight at once")
    bootstrap: int = Field(default=2000, ge=100, description="bootstrap resamples of the items")


@dataclass
class Side:
    """One policy's benchmark run: per-item scores and the canary figures."""

    scores: dict[str, float]  # item id -> mean score over repeats
    tool_call_validity: float
    clarifying_rate: float
    response_tokens: float
    failed_share: float = 0.0  # episodes that failed or timed out (scored 0)
    episodes: list[Episode] = field(repr=False, default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores.values())


async def run_benchmark(
    policy: Policy, harness: Harness, items: list[Task], score: Callable[[Episode], float], config: GateConfig
) -> Side:
    gateway = GatewayClient(_KEY, app=create_app(policy, _KEY))
    tasks = [task for task in items for _ in range(config.repeats)]
    try:  # run exactly as held-out evaluation runs them (a failed episode scores 0)
        _, episodes = await evaluate(gateway, harness, tasks, config.concurrency, timeout=config.timeout)
    finally:
        await gateway.aclose()
    by_item: dict[str, list[float]] = {}
    for task, episode in zip(tasks, episodes):
        by_item.setdefault(task.id, []).append(_scored(score, task, episode) if episode.status == "finished" else 0.0)
    calls = [c for e in episodes for c in e.calls if c.trainable]
    return Side(
        scores={item: statistics.fmean(values) for item, values in by_item.items()},
        tool_call_validity=1 - sum(c.tool_call_error is not None for c in calls) / max(len(calls), 1),
        clarifying_rate=statistics.fmean(clarifying_question(e) for e in episodes),
        response_tokens=statistics.fmean(len(c.completion_ids) for c in calls) if calls else 0.0,
        failed_share=sum(e.status != "finished" for e in episodes) / max(len(episodes), 1),
        episodes=list(episodes),
    )


def _scored(score: Callable[[Episode], float], task: Task, episode: Episode) -> float:
    """The user's score of a finished episode, checked: a failure names the function and the item, not a traceback."""
    try:
        value = score(episode)
    except Exception as exc:  # the user's code
        raise ValueError(f"benchmark.score failed on item {task.id!r}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(value, numbers.Real) or not 0 <= value <= 1:  # NaN and the infinities fail the range too
        raise ValueError(f"benchmark.score returned {value!r} for item {task.id!r}: expected a number in [0, 1]")
    return float(value)


def paired_lower_bound(differences: list[float], confidence: float, resamples: int, seed: int = 0) -> float:
    """The (1 - confidence) percentile of the bootstrap distribution of the mean difference."""
    if len(differences) < 2:
        return differences[0] if differences else 0.0
    rng = random.Random(seed)
    n = len(differences)
    means = sorted(sum(rng.choices(differences, k=n)) / n for _ in range(resamples))
    return means[int((1 - confidence) * resamples)]


def decide(candidate: Side, current: Side, config: GateConfig) -> dict:
    """The gate's decision with every figure it used."""
    items = sorted(current.scores)
    differences = [candidate.scores[i] - current.scores[i] for i in items]
    lower = paired_lower_bound(differences, config.confidence, config.bootstrap)
    canaries = {
        "tool_call_validity": candidate.tool_call_validity >= current.tool_call_validity - config.validity_drop,
        "clarifying_rate": candidate.clarifying_rate <= current.clarifying_rate + config.clarifying_rise,
        "response_length": current.response_tokens / config.length_ratio
        <= candidate.response_tokens
        <= current.response_tokens * config.length_ratio,
        "failed_share": candidate.failed_share <= current.failed_share + config.failure_rise,
    }
    reasons = [] if lower > -config.margin else [f"paired lower bound {lower:+.3f} <= -margin {-config.margin:+.3f}"]
    if 1 - candidate.failed_share < config.min_finished:
        reasons.append(f"the candidate finished {1 - candidate.failed_share:.0%} of its episodes (min_finished "
                       f"{config.min_finished:.0%}): its scores are of failures")  # fmt: skip
    reasons += [f"canary {name} failed" for name, held in canaries.items() if not held]
    return {
        "promote": not reasons,
        "reasons": reasons,
        "items": len(items),
        "eval_candidate": round(candidate.mean, 4),
        "eval_current": round(current.mean, 4),
        "paired_mean_difference": round(statistics.fmean(differences), 4),
        "paired_lower_bound": round(lower, 4),
        "confidence": config.confidence,
        "margin": config.margin,
        "canaries": canaries,
        "canary_figures": {
            name: {"candidate": round(getattr(candidate, name), 4), "current": round(getattr(current, name), 4)}
            for name in ("tool_call_validity", "clarifying_rate", "response_tokens", "failed_share")
        },
    }
