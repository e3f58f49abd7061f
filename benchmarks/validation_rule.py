"""Which update would a stricter checkpoint rule have kept? A replay of `rl.validation_p` over finished runs.

    python benchmarks/validation_rule.py RUN [RUN ...] [--p 1.0 0.3 0.2 0.1 0.05]

For each run of the search job (a folder with validation.jsonl and summary.json) and each P, the job keeps update
0 (the warm start) unless the update it chose beat update 0's validation with one-sided p at most P; keeping update
0 is a gain of exactly 0 (the eval after is the eval before), keeping the chosen update is the run's own gain. The
old rule, P = 1.0, is the baseline beside each P. p is the job's paired permutation test (`validation_choice`) where
validation.jsonl kept each task's scores, else a one-sided two-proportion z-test on the success rates (runs
validated before the scores were kept). An update that beats update 0 less than the chosen one does beats it less
beyond noise too, so keeping the chosen update or update 0 is the whole decision. A run made under a stricter rule
(its config's `rl.validation_p` below 1.0, the default since 2026-12-06) replays only P up to its own: it never
evaluated the updates a looser rule would have kept.
The last line is one JSON object: {"runs": N, "rules": {P: {"mean_gain", "mean_greedy_change",
"runs_with_alarms", "runs_below_0"}}}.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from harnessrl.job.main import validation_choice
from harnessrl.types import read_yaml


def warm_start_p(records: list[dict], chosen: dict) -> float:
    """One-sided p that the chosen update's validation beats update 0's by chance alone."""
    paired = validation_choice(records[:1], chosen["scores"], "success", 1.0)[0] if "scores" in chosen else None
    if paired is not None:  # both kept each task's scores
        return paired
    n, k0, k1 = (
        chosen["episodes"],
        records[0]["success"] * records[0]["episodes"],
        chosen["success"] * chosen["episodes"],
    )
    pooled = (k0 + k1) / (2 * n)
    if pooled in (0.0, 1.0):
        return 1.0
    z = (k1 - k0) / n / math.sqrt(2 * pooled * (1 - pooled) / n)
    return 0.5 * math.erfc(z / math.sqrt(2))


def replay(run: Path) -> dict | None:
    """The chosen update's p above update 0, its sampled and greedy gain and whether it tripped a held-out alarm."""
    if not (run / "validation.jsonl").is_file() or not (run / "summary.json").is_file():
        return None
    records = [json.loads(x) for x in (run / "validation.jsonl").read_text().splitlines()]
    s = json.loads((run / "summary.json").read_text())
    chosen = next((r for r in records if r["update"] == s["chosen_update"]), None)
    if chosen is None or "success" not in chosen:  # no validation, or the swarm job's item-F1
        return None
    config = read_yaml(run / "config.yaml") if (run / "config.yaml").is_file() else {}
    return {
        "run": str(run),
        "own_p": (config.get("rl") or {}).get("validation_p", 1.0),  # runs before the key kept the best: 1.0
        "p": 1.0 if s["chosen_update"] == 0 else warm_start_p(records, chosen),
        "gain": s["heldout_success_after"] - s["heldout_success_before"],
        "greedy": s["heldout_success_greedy_after"] - s["heldout_success_greedy_before"],
        "alarms": bool(s.get("heldout_alarms")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--p", nargs="+", type=float, help="default: 1.0 0.3 0.2 0.1 0.05, those the runs can replay")
    args = parser.parse_args()
    runs = [r for r in map(replay, args.runs) if r is not None]
    if not runs:
        raise SystemExit("no run folder with validation.jsonl and summary.json")
    if args.p is None:
        args.p = [p for p in (1.0, 0.3, 0.2, 0.1, 0.05) if p <= min(r["own_p"] for r in runs)]
        if not args.p:
            raise SystemExit(
                f"no default P at or below the runs' rl.validation_p {min(r['own_p'] for r in runs)}: give --p"
            )
    for r in runs:
        if max(args.p) > r["own_p"]:
            raise SystemExit(
                f"{r['run']} chose its update under rl.validation_p {r['own_p']}: it replays --p up to that only"
            )
    for r in runs:
        print(f"{r['run']}: p {r['p']:.3f} gain {r['gain']:+.3f} greedy {r['greedy']:+.3f} alarms {r['alarms']}")
    rules = {}
    for p in args.p:
        kept = [r for r in runs if r["p"] <= p]  # the others keep update 0: gain 0, no alarm
        rules[str(p)] = {
            "mean_gain": round(sum(r["gain"] for r in kept) / len(runs), 4),
            "mean_greedy_change": round(sum(r["greedy"] for r in kept) / len(runs), 4),
            "runs_with_alarms": sum(r["alarms"] for r in kept),
            "runs_below_0": sum(r["gain"] < 0 for r in kept),
        }
        print(f"P {p}: " + ", ".join(f"{k} {v}" for k, v in rules[str(p)].items()))
    print(json.dumps({"runs": len(runs), "rules": rules}))


if __name__ == "__main__":
    main()
