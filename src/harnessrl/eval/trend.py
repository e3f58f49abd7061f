"""What RL did to the training batches, first updates against last, and alarms when it went the wrong way.

A falling batch reward or success, or a rising share of episodes with a malformed tool call, is a
finding to explain (a policy collapsing, a reward being gamed), not noise to average into a held-out
figure. Batch figures swing with which tasks an update drew, so an alarm needs the change between the
first and the last `window` updates to exceed `SIGMAS` standard errors of that difference.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# metric -> the direction that is harm ("-": falling, "+": rising); None: reported, never an alarm
WATCHED = {"reward/mean": "-", "rollout/success": "-", "rollout/malformed_share": "+", "policy/entropy": None}
ALARMS = {
    "reward/mean": "reward_falling",
    "rollout/success": "success_falling",
    "rollout/malformed_share": "malformed_rising",
}
SIGMAS = 2.0


def training_trend(metrics: Path, window: int = 8) -> dict:
    """{"updates", "window", "<metric>": {"first", "last", "stderr"}, "alarms": [...]} from an RL
    metrics.jsonl (its update lines; `window` shrinks to a third of them when there are few)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    rows = [r for r in rows if "rollout/groups" in r]
    k = min(window, len(rows) // 3)
    out: dict = {"updates": len(rows), "window": k, "alarms": []}
    if k < 2:
        return out
    for name, harm in WATCHED.items():
        first, last = ([r[name] for r in part if name in r] for part in (rows[:k], rows[-k:]))
        if len(first) < 2 or len(last) < 2:
            continue
        stderr = math.sqrt(_var(first) / len(first) + _var(last) / len(last))
        a, b = sum(first) / len(first), sum(last) / len(last)
        out[name] = {"first": round(a, 4), "last": round(b, 4), "stderr": round(stderr, 4)}
        change = b - a if harm == "+" else a - b
        if harm and change > SIGMAS * stderr:
            out["alarms"].append(ALARMS[name])
    return out


def _var(xs: list[float]) -> float:
    mean = sum(xs) / len(xs)
    return sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
