"""Trained self-summarisation vs a prompted compaction of the same length budget, on long tasks.

Two runs of the coding job with the same config, seed and tasks, where the context is small enough
that the agent must summarise itself (`code.summarise_at`, default 384 tokens; `summary_tokens` the
budget): `trained`, where summary tokens carry the episode's loss (Cursor's self-summarisation),
and `prompted`, where the same summary prompt is used but RL masks the summary tokens
(`rl.train.mask_agents: [summariser]`), so the compaction stays what the prompt and SFT made it.
Both chains share the episode's advantage over their segments (`segments: share`).

    python benchmarks/summarise.py [--config examples/code.yaml] [--out runs/summarise]

Last line: {"success_trained": A, "success_prompted": B, "summary_tokens": C, ...} (held-out solved share
after RL; C = mean summary tokens per episode of the trained run's held-out eval).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

from harnessrl.argtypes import at_least
from harnessrl.job import code
from harnessrl.job.config import JobConfig
from harnessrl.types import Episode, read_jsonl


def run(config: JobConfig, out: Path) -> dict:
    """The arm's run: a folder holding this config's run goes on from its finished phases, another's is refused."""
    return code.run(config, out)


def summary_tokens(path: Path) -> float:
    episodes = read_jsonl(path, Episode)
    spent = [sum(len(c.completion_ids) for c in e.calls if c.agent == "summariser") for e in episodes]
    return sum(spent) / max(len(spent), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path(__file__).parents[1] / "examples" / "code.yaml")
    parser.add_argument("--out", type=Path, default=Path("runs/summarise"))
    parser.add_argument("--summarise-at", type=at_least(1), default=384)
    args = parser.parse_args()
    try:
        base = JobConfig.load(args.config)
    except (OSError, ValueError) as exc:  # no such file; not YAML, or a key or value the config refuses
        parser.error(f"--config: {exc}")
    if base.code is None:
        parser.error(f"--config {args.config}: no code: section")
    base.code.summarise_at = args.summarise_at
    base.rl.train.segments = "share"
    results = {}
    for arm, masked in (("trained", []), ("prompted", ["summariser"])):
        config = base.model_copy(deep=True)
        config.rl.train.mask_agents = masked
        results[arm] = run(config, args.out / arm)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs; run folders {args.out}/trained, {args.out}/prompted")
    line = {
        "success_trained": results["trained"]["heldout_success_after"],
        "success_prompted": results["prompted"]["heldout_success_after"],
        "summary_tokens": summary_tokens(args.out / "trained" / "eval_after.jsonl"),
        "hidden_tests_trained": results["trained"]["heldout_hidden_tests_after"],
        "hidden_tests_prompted": results["prompted"]["heldout_hidden_tests_after"],
        "summary_tokens_prompted": summary_tokens(args.out / "prompted" / "eval_after.jsonl"),
        "summarise_at": args.summarise_at,
        "wall_seconds": sum(r["wall_seconds"] for r in results.values()),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
