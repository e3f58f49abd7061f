"""How far to trust a judge: agreement with verifiable outcomes on labelled episodes.

Episodes are grouped by task id (as the trainer groups them) and judged group-relatively, once in
order and once reversed. Reported: accuracy (score >= 0.5 against `outcome.success`), Spearman
correlation between scores and labels, position bias (mean |score change| when the order is
reversed) and the first position's gain (mean score of an answer shown first minus the same answer
shown last), plus the judge's calls, tokens and failures; `groups` counts the groups judged (a group of one, or
one whose judging failed, is not).
"""

from __future__ import annotations

from collections import defaultdict

from harnessrl.rewards.compose import TermFailure
from harnessrl.rewards.judge import Judge
from harnessrl.types import Episode


async def calibrate(judge: Judge, episodes: list[Episode]) -> dict[str, float]:
    groups: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        if e.outcome is None or e.outcome.success is None:
            raise ValueError(f"episode {e.id}: outcome.success is the label calibration needs; it is missing")
        groups[e.task.id].append(e)
    scores, labels, shifts, first_gain, failures, judged = [], [], [], [], 0, 0
    last_failure = None  # named when nothing could be judged: an unreachable judge is not a lack of groups
    for group in groups.values():
        if len(group) < 2:
            continue
        try:
            forward = await judge.group(group)
            backward = (await judge.group(group[::-1]))[::-1]
        except TermFailure as exc:
            failures, last_failure = failures + 1, exc
            continue
        judged += 1
        scores += forward
        labels += [float(e.outcome.success) for e in group]
        shifts += [abs(a - b) for a, b in zip(forward, backward)]
        first_gain += [forward[0] - backward[0], backward[-1] - forward[-1]]
    if not scores:
        why = f" ({failures} failed; the last: {last_failure})" if last_failure else ""
        raise ValueError(f"no group of two or more labelled episodes could be judged{why}")
    return {
        "episodes": len(scores),
        "groups": judged,
        "accuracy": sum((s >= 0.5) == bool(y) for s, y in zip(scores, labels)) / len(scores),
        "spearman": spearman(scores, labels),
        "position_bias": sum(shifts) / len(shifts),
        "first_position_gain": sum(first_gain) / len(first_gain),
        "judge_failures": failures,
        "judge_calls": judge.usage.calls,
        "judge_tokens": judge.usage.prompt_tokens + judge.usage.completion_tokens,
    }


def spearman(x: list[float], y: list[float]) -> float:
    """Pearson correlation of average ranks (ties share their mean rank); 0 when either is constant."""
    rx, ry = _ranks(x), _ranks(y)
    n = len(x)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else 0.0


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks
