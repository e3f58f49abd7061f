"""What RL did to the training batches, first updates against last, and alarms when it went the wrong way.

A falling batch reward or success, or a rising share of episodes with a malformed tool call, is a
finding to explain (a policy collapsing, a reward being gamed), not noise to average into a held-out
figure. Batch figures swing with which tasks an update drew, so an alarm needs the change between the
first and the last `window` updates to be beyond noise: a permutation test over those updates' values
(every split of them into two windows), one-sided p < 0.025 as the held-out alarms. A 2-standard-error rule
on 2 or 3 values a window alarmed on a flat run about one time in five (a window that tied had a standard
error of 0); with so few updates a change cannot be told from noise, and none alarms (3 updates a window
and fewer: the smallest p is 1/20).
"""

from __future__ import annotations

import itertools
import math
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
ALPHA = 0.025  # one-sided, as the held-out alarms (evaluate.permutation_p)


def training_trend(metrics: Path, window: int = 8) -> dict:
    """{"updates", "window", "<metric>": {"first", "last", "stderr", "p"}, "alarms": [...]} from an RL
    metrics.jsonl (its update lines; `window` shrinks to a third of them when there are few). `p` (for a metric
    that can harm) is the share of splits of the 2 x window values whose change is as harmful as the observed one
    or more; a value that is not finite (NaN in a log) is left out."""
    rows = [r for r in read_metrics(metrics) if "rollout/groups" in r] if metrics.exists() else []
    k = min(window, len(rows) // 3)
    out: dict = {"updates": len(rows), "window": k, "alarms": []}
    if k < 2:
        return out
    for name, (harm, alarm) in WATCHED.items():
        first, last = ([r[name] for r in part if _finite(r.get(name))] for part in (rows[:k], rows[-k:]))
        if len(first) < 2 or len(last) < 2:
            continue
        stderr = (variance(first) / len(first) + variance(last) / len(last)) ** 0.5
        a, b = fmean(first), fmean(last)
        out[name] = {"first": round(a, 4), "last": round(b, 4), "stderr": round(stderr, 4)}
        if harm:
            out[name]["p"] = p = round(_harm_p(first, last, harm), 4)
            if p < ALPHA:
                out["alarms"].append(alarm)
    return out


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _harm_p(first: list[float], last: list[float], harm: int) -> float:
    """Exact one-sided permutation p-value: of every way to split the values into groups of these sizes, the share
    whose change (mean of the second - of the first, times `harm`) is at least the observed one (at most 16 values
    a window of 8: 12,870 splits)."""
    values, total, n = first + last, sum(first) + sum(last), len(last)
    observed = harm * (fmean(last) - fmean(first))
    floor = observed - 1e-9 * max(1.0, abs(observed))  # ties count as harmful, float rounding aside
    changes = (harm * (s / n - (total - s) / len(first)) for s in map(sum, itertools.combinations(values, n)))
    return sum(change >= floor for change in changes) / math.comb(len(values), n)
