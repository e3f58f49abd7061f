"""PNG plots for run folders (matplotlib, headless): metric curves over updates, held-out bars.

Curves of several runs share one figure: a colour per metric key, a line style per run.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

RUN_STYLES = ["-", "--", ":", "-."]
SMOOTH = 5  # the trailing mean drawn beside a batch metric (plot_curves' `smooth`)
HELDOUT = [  # (bar group, summary key before RL, summary key after RL)
    ("sampled (T=1)", "heldout_success_before", "heldout_success_after"),
    ("greedy", "heldout_success_greedy_before", "heldout_success_greedy_after"),
]


@contextlib.contextmanager
def _pyplot():
    """pyplot, headless, with `$` in text as itself: a task family or a run named `in $_usd$` is not math markup
    (matplotlib's, which garbled such a label or failed the whole plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context({"text.parse_math": False}):
        yield plt


def reward_keys(rows: list[dict]) -> list[str]:
    """reward/mean and every reward/<term> the rows carry (not the batch std and max)."""
    keys = {k for r in rows for k in r if k.startswith("reward/") and k not in ("reward/std", "reward/max")}
    return sorted(keys, key=lambda k: (k != "reward/mean", k))


def plot_rewards(metrics: Path, out: Path) -> None:
    """reward/mean and every reward/<term> over RL updates."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if '"reward/mean"' in line]
    if rows:
        plot_curves(
            {"": rows},
            reward_keys(rows),
            out,
            "reward and its terms over updates",
            "reward",
            smooth=SMOOTH,
        )


def plot_curves(
    runs: dict[str, list[dict]],
    keys: list[str],
    out: Path,
    title: str,
    ylabel: str,
    log: bool = False,
    x: str | None = None,
    smooth: int = 0,
) -> None:
    """Each key over the rows of each run that have it; x is the row's 1-based position (the update), or its
    value of the key `x` (validation's `update`, which skips updates).

    `runs` maps a label ("" for a single unnamed run) to its rows; `log` uses a log y axis when
    every plotted value is positive. `smooth` > 0 draws the first key's trailing mean over that many points
    beside it (wide and pale), where there are twice as many: a batch of a few tasks swings with which tasks it drew.
    """
    with _pyplot() as plt:
        from matplotlib.ticker import MaxNLocator

        figure, axis = plt.subplots(figsize=(8, 4.5))
        colours = {key: f"C{i % 10}" for i, key in enumerate(keys)}
        values = []
        for r, (label, rows) in enumerate(runs.items()):
            for key in keys:
                points = [
                    (row[x] if x else i, row[key])
                    for i, row in enumerate(rows, start=1)
                    if not math.isnan(as_number(row.get(key)))
                ]
                if not points:
                    continue
                xs, ys = zip(*points)
                values += ys
                name = f"{label}: {key}" if label else key
                width = 2 if key == "reward/mean" else 1.2
                axis.plot(
                    xs,
                    ys,
                    RUN_STYLES[r % len(RUN_STYLES)],
                    color=colours[key],
                    label=name,
                    linewidth=width,
                    marker="o" if len(xs) < 30 else None,
                    markersize=3,
                )
                if smooth and key == keys[0] and len(ys) >= 2 * smooth:
                    style, means = RUN_STYLES[r % len(RUN_STYLES)], trailing_mean(ys, smooth)
                    axis.plot(
                        xs, means, style, color=colours[key], linewidth=5, alpha=0.3, label=f"{name}, mean of {smooth}"
                    )
        if log and values and min(values) > 0:
            axis.set_yscale("log")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set(xlabel="update", ylabel=ylabel, title=title)
        axis.legend(fontsize=7, ncol=2)
        axis.grid(alpha=0.3)
        _save(plt, figure, out)


def trailing_mean(values: list[float], n: int) -> list[float]:
    """Each value's mean with the n - 1 before it (fewer at the start)."""
    return [sum(values[max(0, i + 1 - n) : i + 1]) / min(i + 1, n) for i in range(len(values))]


def plot_heldout(summary: dict, out: Path) -> None:
    """Held-out success before and after RL, sampled and greedy, from a summary.json."""
    plot_heldout_runs({"": summary}, out)


def plot_heldout_runs(summaries: dict[str, dict], out: Path) -> None:
    """The same bars for several runs side by side; a missing key leaves its bar out. Sampled success
    by the tasks' number of gold documents (`heldout_by_gold_docs`) gets a bar group per count, and by
    task family (`heldout_by_family`) one per family."""
    with _pyplot() as plt:
        bars_of = {label: _heldout_bars(s) for label, s in summaries.items()}
        groups = list(dict.fromkeys(g for b in bars_of.values() for g in b))
        bars = [(label, when, index) for label in summaries for when, index in (("before RL", 0), ("after RL", 1))]
        width = 0.8 / len(bars)
        figure, axis = plt.subplots(figsize=(5 + 1.5 * (len(summaries) - 1) + 0.8 * max(0, len(groups) - 2), 3.5))
        for b, (label, when, index) in enumerate(bars):
            heights = [bars_of[label].get(g, (math.nan, math.nan))[index] for g in groups]
            xs = [x - 0.4 + width * (b + 0.5) for x in range(len(groups))]
            axis.bar(xs, heights, width=width, label=f"{label}: {when}" if label else when)
        tilt = {"rotation": 30, "ha": "right"} if len(groups) > 5 else {}
        axis.set_xticks(list(range(len(groups))), groups, fontsize=8, **tilt)
        axis.set(ylim=(0, 1), ylabel="held-out success", title="held-out tasks")
        axis.legend(fontsize=7)
        _save(plt, figure, out)


def _heldout_bars(summary: dict) -> dict[str, tuple[float, float]]:
    """Bar group -> (before RL, after RL) of one summary.json."""
    bars = {
        g[0]: (as_number(summary.get(g[1])), as_number(summary.get(g[2])))
        for g in HELDOUT
        if g[1] in summary or g[2] in summary
    }
    for n, row in (summary.get("heldout_by_gold_docs") or {}).items():
        if isinstance(row, dict):
            name = f"sampled, {n} gold doc{'s' if n != '1' else ''}"
            bars[name] = (as_number(row.get("success_before")), as_number(row.get("success_after")))
    for family, row in (summary.get("heldout_by_family") or {}).items():
        if isinstance(row, dict):
            bars[f"sampled, {family}"] = (as_number(row.get("success_before")), as_number(row.get("success_after")))
    return bars


def as_number(value) -> float:
    """A JSON value as a float: NaN for anything but a number (a bool is not one)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _save(plt, figure, out: Path) -> None:
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
