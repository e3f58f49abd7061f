"""Single search agent vs the swarm on the same held-out wide tasks, before and after orchestrator RL.

Runs the swarm job (examples/swarm.yaml unless --config; it trains the search main job first when
the frozen sub-agent's best/ is absent) and reads its summary: the baseline (one search agent taking
the questions in turn) and the orchestrator over frozen copies of the same search agent run on the
same held-out tasks in the same run, and the scripted orchestrator too (`_scripted`: what delegation
alone gives with these sub-agents). critical_steps_reduction = the baseline's critical steps per
episode / the swarm's after RL (Kimi reports up to 4.5x).

The reduction grows with the width of a task (the baseline's steps grow with it, one round of
delegation's do not), so `--widths 12,16` adds the baseline and the scripted orchestrator at those
widths over the same frozen sub-agent (the same job with no SFT and no RL, in OUT/width-N; its
untrained orchestrator is evaluated too and ignored): `scripted_by_width`.

    python benchmarks/swarm.py [--config examples/swarm.yaml] [--out runs/swarm-bench] [--widths 12,16]

Last line: {"critical_steps_reduction": X, "f1_single": A, "f1_swarm": B, "f1_swarm_before_rl": C, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
from pathlib import Path

from harnessrl.argtypes import at_least
from harnessrl.job import swarm
from harnessrl.job.config import JobConfig

KEYS = ["critical_steps_reduction", "f1_single", "f1_swarm", "f1_swarm_before_rl", "f1_swarm_scripted",
        "f1_swarm_greedy_before_rl", "f1_swarm_greedy", "chosen_update", "critical_steps_single",
        "critical_steps_swarm", "critical_steps_swarm_before_rl",
        "critical_steps_swarm_scripted", "total_steps_single", "total_steps_swarm", "width", "heldout_tasks",
        "rl_updates", "wall_seconds", "peak_memory_mb"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path(__file__).parents[1] / "examples" / "swarm.yaml")
    parser.add_argument("--out", type=Path, default=Path("runs/swarm-bench"))
    parser.add_argument("--fresh", action="store_true", help="delete --out first (else its finished phases are kept)")
    parser.add_argument(
        "--widths", type=width_list, default=[], help="more widths for the scripted orchestrator, e.g. 12,16"
    )
    args = parser.parse_args()
    if args.fresh:
        shutil.rmtree(args.out, ignore_errors=True)
    try:
        config = JobConfig.load(args.config)
    except (OSError, ValueError) as exc:  # no such file; not YAML, or a key or value the config refuses
        parser.error(f"--config: {exc}")
    if config.swarm is None:
        parser.error(f"--config {args.config}: no swarm: section")
    # a run folder holding this config's run goes on from its finished phases; one of another config is refused
    summary = swarm.run(config, args.out)
    metrics = args.out / "metrics.jsonl"  # absent when RL made no update
    rl = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    by_update = {key: [round(m.get(key, float("nan")), 3) for m in rl] for key in
                 ("reward/item_f1", "swarm/spawn_rate", "swarm/finish_rate", "swarm/critical_steps")}  # fmt: skip
    widths = {summary["width"]: structure(summary)}
    for width in args.widths:
        widths[width] = structure(scripted_at(config, width, summary["subagent_model"], args.out / f"width-{width}"))
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs; run folder {args.out}")
    for key, values in by_update.items():
        print(f"{key} by update: {values}")
    for width, figures in widths.items():
        print(f"width {width}: {figures}")
    print(json.dumps({k: summary[k] for k in KEYS} | {"by_update": by_update, "scripted_by_width": widths}))


def width_list(text: str) -> list[int]:
    """--widths: parsed before the job runs (a typo used to fail after it, with a traceback)."""
    return [at_least(2)(w) for w in text.split(",") if w.strip()]


def scripted_at(config: JobConfig, width: int, subagent: str, out: Path) -> dict:
    """The baseline and the scripted orchestrator on wide tasks of `width` questions (no SFT, no RL)."""
    if (out / "summary.json").is_file():
        return json.loads((out / "summary.json").read_text())
    swarm_config = config.swarm.model_copy(update={"width": width, "subagent_model": subagent})
    swarm_config.limits = swarm_config.limits.model_copy(
        update={k: max(getattr(swarm_config.limits, k), width) for k in ("max_parallel", "max_assignments")}
    )
    sizes = {
        "sft": config.sft.model_copy(update={"steps": 0}),
        "rl": config.rl.model_copy(update={"updates": 0, "validation_tasks": 0}),
    }
    return swarm.run(config.model_copy(update={"swarm": swarm_config, **sizes}), out)


def structure(summary: dict) -> dict:
    single, scripted = summary["critical_steps_single"], summary["critical_steps_swarm_scripted"]
    return {"critical_steps_single": round(single, 2), "critical_steps_scripted": round(scripted, 2),
            "scripted_reduction": round(single / scripted, 2), "f1_single": round(summary["f1_single"], 3),
            "f1_scripted": round(summary["f1_swarm_scripted"], 3), "heldout_tasks": summary["heldout_tasks"]}  # fmt: skip


if __name__ == "__main__":
    main()
