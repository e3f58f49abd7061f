"""What RL did to the training batches, first updates against last, and alarms when it went the wrong way.

A falling batch reward or success, or a rising share of episodes with a malformed tool call, is a
finding to explain (a policy collapsing, a reward being gamed), not noise to average into a held-out
figure. Batch figures swing with which tasks an update drew, so an alarm needs the change between the
first and the last `window` updates to exceed `SIGMAS` standard errors of that difference.
"""

from __future__ import annotations

from pathlib import Path
from statistics import fmean, variance

from harnessrl.eval.report import read_metrics

# metric -> (the direction that is harm: -1 falling, +1 rising, 0 none; the alarm it trips)
WATCHED = {
    "reward/mean": (-1, "reward_falling"),
    "rollout/success": (-1, "success_falling"),
    "rollout/malformed_share": (+1, "malformed_rising"),
    "policy/entropy": (0, None),  # reported, never an alarm
}
SIGMAS = 2.0


def training_trend(metrics: Path, window: int = 8) -> dict:
    """{"updates", "window", "<metric>": {"first", "last", "stderr"}, "alarms": [...]} from an RL
    metrics.jsonl (its update lines; `window` shrinks to a third of them when there are few)."""
    rows = [r for r in read_metrics(metrics) if "rollout/groups" in r] if metrics.exists() else []
    k = min(window, len(rows) // 3)
    out: dict = {"updates": len(rows), "window": k, "alarms": []}
    if k < 2:
        return out
    for name, (harm, alarm) in WATCHED.items():
        first, last = ([r[name] for r in part if name in r] for part in (rows[:k], rows[-k:]))
        if len(first) < 2 or len(last) < 2:
            continue
        stderr = (variance(first) / len(first) + variance(last) / len(last)) ** 0.5
        a, b = fmean(first), fmean(last)
        out[name] = {"first": round(a, 4), "last": round(b, 4), "stderr": round(stderr, 4)}
        if harm and harm * (b - a) > SIGMAS * stderr:
            out["alarms"].append(alarm)
    return out
