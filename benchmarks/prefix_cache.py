"""The search agent's held-out eval with the engine's prefix cache (`Engine.prefix_cache`, the jobs'
`prefix_cache`) against without it: same model, same tasks, greedy episodes (so both sides generate
the same tokens and do the same work but for prefill), alternating off / on.

    python benchmarks/prefix_cache.py [--model tiny-base] [--tasks 44] [--rounds 2] [--tokens 32768]

Each of an agent's turns sends the whole conversation again (the earlier prompt, the reply, the
tool's result); without the cache the engine prefills all of it, with it only what follows the
last reply. `--model` takes a run's `best/` (a trained search agent makes longer episodes than the
untrained tiny-base). The last line is one JSON object:
{"eval_speedup": X, "seconds_off": A, "seconds_on": B, "prefill_tokens_reused": R, "prompt_tokens": P, ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from harnessrl.argtypes import at_least
from harnessrl.envs.search import SearchAgent, SearchIndex, synthetic
from harnessrl.eval.heldout import evaluate
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.job.config import AgentConfig, DataConfig
from harnessrl.policy import Policy


async def one_eval(policy: Policy, agent: SearchAgent, tasks) -> tuple[float, list]:
    gateway = GatewayClient("benchmark-key", app=create_app(policy, "benchmark-key"))
    try:
        started = time.perf_counter()
        _, episodes = await evaluate(gateway, agent, tasks)
        return time.perf_counter() - started, episodes
    finally:
        await gateway.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-base")
    parser.add_argument("--tasks", type=at_least(1), default=44)
    parser.add_argument("--rounds", type=at_least(1), default=2)
    parser.add_argument(
        "--tokens", type=at_least(1), default=32768, help="the cache's size in tokens (the jobs' default)"
    )
    args = parser.parse_args()
    data = DataConfig()  # the main job's corpus and held-out tasks
    docs, items = synthetic(data.synthetic_seed, people=data.synthetic_people)
    tasks = [t.task() for t in items if t.split == "test"][: args.tasks]
    a = AgentConfig()
    with tempfile.TemporaryDirectory() as folder:
        agent = SearchAgent(SearchIndex(docs, Path(folder)), a.context_budget, a.max_turns, a.k, a.max_tokens,
                            temperature=0.0)  # fmt: skip
        policy = Policy.load(args.model, seed=0)
        policy.engine.prefill_share = None  # as the jobs run it
        seconds = {"off": [], "on": []}
        try:
            await one_eval(policy, agent, tasks[:4])  # warm-up: imports, the index's first queries
            for _ in range(args.rounds):
                for side, tokens in (("off", 0), ("on", args.tokens)):
                    policy.engine.prefix_cache, reused = tokens, policy.engine.prefix_tokens_reused
                    policy.engine._prefixes.clear()
                    took, episodes = await one_eval(policy, agent, tasks)
                    seconds[side].append(took)
                    prompt_tokens = sum(len(c.prompt_ids) for e in episodes for c in e.calls)
                    calls = sum(len(e.calls) for e in episodes)
                    print(f"{side}: {took:.1f} s, {calls} calls, {prompt_tokens} prompt tokens, "
                          f"{policy.engine.prefix_tokens_reused - reused} reused from the cache")  # fmt: skip
        finally:
            policy.close()
    off, on = statistics.median(seconds["off"]), statistics.median(seconds["on"])
    reused = policy.engine.prefix_tokens_reused // args.rounds
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; medians of {args.rounds}")
    print(json.dumps({"eval_speedup": round(off / on, 3), "seconds_off": round(off, 2), "seconds_on": round(on, 2),
                      "prefill_tokens_reused": reused, "prompt_tokens": prompt_tokens, "calls": calls,
                      "tasks": len(tasks)}))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
