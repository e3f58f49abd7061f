"""The search agent with and without context pruning, on the same tasks: peak context and recall.

    python benchmarks/context_pruning.py [--tasks 60] [--details 6] [--extra-searches 3] [--k 5] [--budget 3072]
                                         [--corpus corpus.jsonl --tasks-file tasks.jsonl]

The agent is the scripted search expert (`envs/search/expert.py`) acting through the real
harness, gateway and chat template of `tiny-base`, so token counts are those the model would see:
it searches with the question, follows each gold document's title (the multi-hop bridge), reads
documents only partly shown, makes `--extra-searches` more searches, and answers. The two arms
differ only in pruning: "with" prunes, after every step, each chunk in context that is not from a
gold document (an oracle relevance judgement: the upper bound of what a learned pruner can save);
"without" never prunes. Same budget for both (at the budget the harness allows only pruning and
answering, so an arm that cannot prune stops searching there).

Default corpus: the synthetic generator with `--details` filler sentences per document, so chunks
have realistic length (the plain generator's one-sentence documents leave nothing to prune).

  peak_context_reduction  mean peak context (prompt + completion tokens of the largest call)
                          without pruning / with pruning
  recall_with_prune,      trajectory recall: the share of gold documents whose text entered the
  recall_without          context, averaged over tasks

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
from pathlib import Path

from rich.progress import track

from harnessrl.argtypes import at_least
from harnessrl.envs.search import SearchAgent, SearchIndex, context1_reward, load, synthetic
from harnessrl.envs.search.expert import SearchExpert
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.policy import Policy
from harnessrl.rollout import RolloutConfig, RolloutEngine

ADMIN = "bench-admin-key"


async def arm(prune: str, gateway: GatewayClient, index: SearchIndex, tasks, args) -> list[dict]:
    agent = SearchAgent(index, context_budget=args.budget, max_turns=64, k=args.k)
    expert = SearchExpert(
        agent, p_distractor=0.0, p_skip=0.0, p_extra_doc=0.0, prune=prune, extra_searches=args.extra_searches
    )
    engine = RolloutEngine(gateway, expert, context1_reward(), RolloutConfig(group_size=2))  # episode() runs one
    rows = []
    for task in track(tasks, description=f"prune={prune}"):
        episode = await engine.episode(task)
        if episode.status != "finished":  # e.g. a prompt past the model's context: --budget too near it
            raise SystemExit(f"prune={prune}, task {task.id}: {episode.failure_reason}")
        info = episode.outcome.info
        gold = set(task.data["gold_doc_ids"])
        rows.append(
            {
                "peak": info["peak_context"],
                "recall": len(gold & set(info["trajectory_doc_ids"])) / len(gold),
                "turns": info["turns"],
            }
        )
    return rows


async def main(args) -> dict:
    if args.corpus:
        docs, items = load(args.corpus, args.tasks_file)
    else:
        docs, items = synthetic(0, details=args.details)
    tasks = [t.task() for t in items][: args.tasks]
    policy = Policy.load("tiny-base")
    gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN))
    try:
        with tempfile.TemporaryDirectory() as folder:
            index = SearchIndex(docs, Path(folder))
            with_prune = await arm("always", gateway, index, tasks, args)
            without = await arm("never", gateway, index, tasks, args)
    finally:
        await gateway.aclose()
        policy.close()
    mean = lambda rows, key: statistics.fmean(r[key] for r in rows)  # noqa: E731
    return {
        "peak_context_reduction": round(mean(without, "peak") / mean(with_prune, "peak"), 3),
        "recall_with_prune": round(mean(with_prune, "recall"), 3),
        "recall_without": round(mean(without, "recall"), 3),
        "peak_with_prune": round(mean(with_prune, "peak"), 1),
        "peak_without": round(mean(without, "peak"), 1),
        "turns_with_prune": round(mean(with_prune, "turns"), 2),
        "turns_without": round(mean(without, "turns"), 2),
        "tasks": len(tasks), "budget": args.budget, "k": args.k, "extra_searches": args.extra_searches,
        "details": None if args.corpus else args.details, "machine": platform.machine(),
    }  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=at_least(1), default=60, help="first N tasks (both splits)")
    parser.add_argument("--details", type=at_least(0), default=6, help="filler sentences per synthetic document")
    parser.add_argument("--extra-searches", type=at_least(0), default=3)
    parser.add_argument("--k", type=at_least(1), default=5, help="chunks per search")
    parser.add_argument(
        "--budget",
        type=at_least(1),
        default=3072,
        help="context budget (tokens), the same for both arms; the arm without pruning ends ~650 tokens past it, "
        "inside tiny-base's context of 4096",
    )
    parser.add_argument(
        "--corpus", type=Path, help="corpus.jsonl (with --tasks-file); default: the synthetic generator"
    )
    parser.add_argument("--tasks-file", type=Path)
    args = parser.parse_args()
    if (args.corpus is None) != (args.tasks_file is None):
        parser.error("--corpus and --tasks-file go together (without both: the synthetic generator)")
    print(json.dumps(asyncio.run(main(args))))
