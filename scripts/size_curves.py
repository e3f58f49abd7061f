"""Probe accuracy against pretraining minutes for runs of different model sizes, on one time axis.

    python scripts/size_curves.py RUN... [--out size_curves.png] [--steps 6]

Each RUN is a `pretrain_tiny_base.py` run folder (its log's probes, 40 items a skill). Step times in a log are those
of the machine and load it ran on (runs trained side by side share the cores), so the time axis here is each
probe's step times this machine's seconds a step at the run's size, measured now: `--steps` steps of a fresh model
of the run's size on a batch of the run's shape, in the precision this CPU trains in. Run it on a quiet machine.
One panel a skill and one of the loss; the last line printed is JSON: per run its size, parameters, fp16 MB, seconds
a step, its probes as [step, minutes, scores] and its loss as [step, minutes, mean of the hundred's steps to it].
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from harnessrl.policy.mixture import SKILLS
from harnessrl.policy.tiny import build_tiny
from harnessrl.train.checkpoint import latest_checkpoint, load_state
from harnessrl.train.precision import autocast, resolve


def step_seconds(model, vocab: int, rows: int, width: int, steps: int, precision: str) -> float:
    """Median seconds of one optimizer step of a fresh `model` (after one warm-up step)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (rows, width), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        with autocast(precision):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[steps // 2]


def read_run(folder: Path) -> dict:
    checkpoint = latest_checkpoint(folder / "checkpoints")
    if checkpoint is None:
        raise SystemExit(f"{folder}: no checkpoint under {folder / 'checkpoints'}")
    config = json.loads((checkpoint / "config.json").read_text())
    if not (folder / "log.jsonl").is_file():
        raise SystemExit(f"{folder}: no log.jsonl (not a run of scripts/pretrain_tiny_base.py?)")
    args = load_state(checkpoint, map_location="cpu")["args"]
    probes, losses = [], []
    for number, line in enumerate((folder / "log.jsonl").read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            print(f"{folder / 'log.jsonl'}:{number}: not JSON, left out")
            continue
        losses.append((record["step"], record["loss"]))
        if "probe" in record:
            probes.append((record["step"], record["probe"]))
    blocks: dict[int, list[tuple[int, float]]] = {}  # the log's steps in hundreds (a step's loss is one batch's)
    for step, loss in losses:
        blocks.setdefault((step - 1) // 100, []).append((step, loss))
    return {"run": str(folder), "hidden": config["hidden_size"], "layers": config["num_hidden_layers"],
            "rows": args["rows"], "width": args["width"], "probes": probes,
            "loss": [(b[-1][0], sum(v for _, v in b) / len(b)) for b in blocks.values()]}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("size_curves.png"))
    parser.add_argument("--steps", type=int, default=6, help="timed steps a size")
    args = parser.parse_args(argv)
    if args.steps < 1:
        raise SystemExit(f"--steps: expected 1 or more, got {args.steps}")
    precision, why = resolve("auto")
    print(why)
    runs = [read_run(folder) for folder in args.runs]
    for run in runs:  # a fresh model of the run's size: its parameters counted, its step timed
        model, tokenizer = build_tiny(hidden=run["hidden"], layers=run["layers"])
        params = sum(p.numel() for p in model.parameters())
        run["params_m"], run["fp16_mb"] = round(params / 1e6, 2), round(params * 2 / 1e6, 1)
        run["seconds_per_step"] = round(step_seconds(model, len(tokenizer), run["rows"], run["width"], args.steps, precision), 3)  # fmt: skip
        run["probes"] = [[s, round(s * run["seconds_per_step"] / 60, 1), p] for s, p in run["probes"]]
        run["loss"] = [[s, round(s * run["seconds_per_step"] / 60, 1), round(v, 3)] for s, v in run["loss"]]
        print(f"hidden {run['hidden']}, {run['layers']} layers: {run['params_m']} M parameters, "
              f"{run['seconds_per_step']} s a step, {len(run['probes'])} probes")  # fmt: skip

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 5, figsize=(17, 6), sharex=True)
    for run in runs:
        axes[1, 4].plot(
            [m for _, m, _ in run["loss"]], [v for _, _, v in run["loss"]], label=f"{run['hidden']}x{run['layers']}"
        )
    axes[1, 4].set(title="loss (mean of 100 steps)")
    axes[1, 4].grid(alpha=0.3)
    for axis, skill in zip([*axes[0], *axes[1, :4]], (*SKILLS, "mean")):
        for run in runs:
            xs = [m for _, m, _ in run["probes"]]
            ys = [_mean(p) if skill == "mean" else p.get(skill, 0.0) for _, _, p in run["probes"]]
            axis.plot(xs, ys, marker="o", markersize=3, label=f"{run['hidden']}x{run['layers']} ({run['params_m']} M)")
        axis.axhline(0.8, color="grey", linestyle=":", linewidth=0.8)
        axis.set(title=skill, ylim=(0, 1.02))
        axis.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    figure.supxlabel(f"minutes of pretraining steps alone on this CPU ({precision})")
    figure.supylabel("probe accuracy (40 items a skill, greedy, exact)")
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    print(json.dumps({"precision": precision, "runs": runs}))


def _mean(probe: dict[str, float]) -> float:
    """The mean over the skills a probe scored (a run from before a skill was added has none of it)."""
    scored = [probe[s] for s in SKILLS if s in probe]
    return sum(scored) / max(len(scored), 1)


if __name__ == "__main__":
    main()
