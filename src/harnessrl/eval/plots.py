"""PNG plots for a run folder (matplotlib, headless)."""

from __future__ import annotations

import json
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_rewards(metrics: Path, out: Path) -> None:
    """reward/mean and every reward/<term> over RL updates."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if '"reward/mean"' in line]
    if not rows:
        return
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8, 4.5))
    keys = sorted({k for r in rows for k in r if k.startswith("reward/") and k not in ("reward/std", "reward/max")})
    for key in keys:
        axis.plot([r["step"] for r in rows], [r.get(key, float("nan")) for r in rows], label=key, linewidth=2 if key == "reward/mean" else 1)
    axis.set(xlabel="trainer step", ylabel="reward", title="reward and its terms over updates")
    axis.legend(fontsize=7, ncol=2)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def plot_heldout(summary: dict, out: Path) -> None:
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5, 3.5))
    labels = ["sampled (T=1)", "greedy"]
    before = [summary["heldout_success_before"], summary["heldout_success_greedy_before"]]
    after = [summary["heldout_success_after"], summary["heldout_success_greedy_after"]]
    xs = range(len(labels))
    axis.bar([x - 0.2 for x in xs], before, width=0.4, label="before RL")
    axis.bar([x + 0.2 for x in xs], after, width=0.4, label="after RL")
    axis.set_xticks(list(xs), labels)
    axis.set(ylim=(0, 1), ylabel="held-out success", title="held-out tasks")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
