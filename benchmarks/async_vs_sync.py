"""Asynchronous vs synchronous RL: the same number of updates with staleness k = 0 and k = 2.

    python benchmarks/async_vs_sync.py [--updates 6] [--group-size 8] [--groups 4] [--turns 3]

The harness is an ordinary openai-client agent on the tiny model whose tool calls take 100-300 ms
(uniform, seeded), like real tools; every turn calls the tool once. A second mode, `longtail`, draws
the latency from a heavy tail (Pareto, alpha 1.2, minimum 0.1 s, cut at 10 s: a few calls take
seconds, like a slow test run or a rate-limited API), the regime where a synchronous batch waits
for its slowest episode (AReaL's 2.77x). With k = 0 the trainer waits for
every batch and rollouts wait for every update; with k = 2 rollouts continue while the trainer
updates, and batches older than 2 versions are dropped. Same tasks, same trainer settings, measured
in one run. The last line is one JSON object: {"async_speedup": X, ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import time

import openai

from harnessrl.argtypes import at_least
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.policy import Policy
from harnessrl.rewards import Reward, weighted
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.train import TrainConfig, Trainer
from harnessrl.types import Outcome, Task

ADMIN = "bench-admin-key"


def latency(mode: str, rng: random.Random) -> float:
    if mode == "uniform":
        return rng.uniform(0.1, 0.3)
    return min(10.0, 0.1 * rng.paretovariate(1.2))  # heavy tail: median 0.18 s, 1 % above 4.6 s


def make_harness(turns: int, rng: random.Random, mode: str):
    async def harness(task: Task, llm: openai.AsyncOpenAI) -> Outcome:
        messages = [{"role": "user", "content": task.prompt}]
        answer = ""
        for turn in range(turns):
            r = await llm.chat.completions.create(model="tiny", messages=messages, max_tokens=24)
            answer = r.choices[0].message.content or ""
            await asyncio.sleep(latency(mode, rng))  # the tool call's latency
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": f"tool result {turn}: ok"},
            ]
        return Outcome(answer=answer)

    return harness


async def run(staleness: int, mode: str, args) -> tuple[float, dict]:
    policy = Policy.load("tiny")
    gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN))
    reward = Reward(
        [weighted("e_share", lambda e: (e.outcome.answer or "").count("e") / max(1, len(e.outcome.answer or "")))]
    )
    config = RolloutConfig(
        group_size=args.group_size, groups_per_update=args.groups, staleness=staleness, concurrency=64
    )
    engine = RolloutEngine(gateway, make_harness(args.turns, random.Random(0), mode), reward, config)
    trainer = Trainer(policy.model, policy.tokenizer, TrainConfig(lr=1e-4), policy=policy)
    tasks = itertools.cycle([Task(id=f"t{i}", prompt=f"Plan trip number {i}.") for i in range(16)])
    start = time.perf_counter()
    await engine.train(trainer, tasks, args.updates, progress=False)
    seconds = time.perf_counter() - start
    await gateway.aclose()
    policy.close()
    return seconds, dict(engine.counts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=at_least(1), default=6)
    parser.add_argument("--group-size", type=at_least(1), default=8)
    parser.add_argument("--groups", type=at_least(1), default=4)
    parser.add_argument("--turns", type=at_least(1), default=3)
    args = parser.parse_args()
    results = {}
    for mode in ("uniform", "longtail"):
        for k in (0, 2):
            seconds, counts = asyncio.run(run(k, mode, args))
            results[mode, k] = seconds
            print(f"{mode} k={k}: {args.updates} updates in {seconds:.1f} s; {counts}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs; tiny model, {args.groups} groups x {args.group_size} episodes x {args.turns} turns per update"
    )
    print(
        json.dumps(
            {
                "async_speedup": round(results["uniform", 0] / results["uniform", 2], 3),
                "sync_seconds": round(results["uniform", 0], 1),
                "async_seconds": round(results["uniform", 2], 1),
                "async_speedup_longtail": round(results["longtail", 0] / results["longtail", 2], 3),
                "sync_seconds_longtail": round(results["longtail", 0], 1),
                "async_seconds_longtail": round(results["longtail", 2], 1),
            }
        )
    )


if __name__ == "__main__":
    main()
