"""Single search agent vs the swarm on the same held-out wide tasks, before and after orchestrator RL.

Runs the swarm job (examples/swarm.yaml unless --config; it trains the search main job first when
the frozen sub-agent's best/ is absent) and reads its summary: the baseline (one search agent taking
the questions in turn) and the orchestrator over frozen copies of the same search agent run on the
same held-out tasks in the same run, and the scripted orchestrator too (`_scripted`: what delegation
alone gives with these sub-agents). critical_steps_reduction = the baseline's critical steps per
episode / the swarm's after RL (Kimi reports up to 4.5x).

    python benchmarks/swarm.py [--config examples/swarm.yaml] [--out runs/swarm-bench]

Last line: {"critical_steps_reduction": X, "f1_single": A, "f1_swarm": B, "f1_swarm_before_rl": C, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
from pathlib import Path

from harnessrl.job import swarm
from harnessrl.job.config import JobConfig

KEYS = ["critical_steps_reduction", "f1_single", "f1_swarm", "f1_swarm_before_rl", "f1_swarm_scripted",
        "critical_steps_single", "critical_steps_swarm", "critical_steps_swarm_before_rl",
        "critical_steps_swarm_scripted", "total_steps_single", "total_steps_swarm", "width", "heldout_tasks",
        "rl_updates", "wall_seconds", "peak_memory_mb"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path(__file__).parents[1] / "examples" / "swarm.yaml")
    parser.add_argument("--out", type=Path, default=Path("runs/swarm-bench"))
    parser.add_argument("--fresh", action="store_true", help="delete --out first (else its finished phases are kept)")
    args = parser.parse_args()
    if args.fresh:
        shutil.rmtree(args.out, ignore_errors=True)
    config = JobConfig.load(args.config)
    if config.swarm is None:
        parser.error(f"--config {args.config}: no swarm: section")
    # a run folder already there is resumed: its finished phases are read back, not rerun
    summary = swarm.resume(args.out) if (args.out / "config.yaml").is_file() else swarm.run(config, args.out)
    rl = [json.loads(line) for line in (args.out / "metrics.jsonl").read_text().splitlines()]
    by_update = {key: [round(m.get(key, float("nan")), 3) for m in rl] for key in
                 ("reward/item_f1", "swarm/spawn_rate", "swarm/finish_rate", "swarm/critical_steps")}  # fmt: skip
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs; run folder {args.out}")
    for key, values in by_update.items():
        print(f"{key} by update: {values}")
    print(json.dumps({k: summary[k] for k in KEYS} | {"by_update": by_update}))


if __name__ == "__main__":
    main()
