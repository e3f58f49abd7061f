"""Ray rollout workers: one vs two on an I/O-bound harness (tool latency dominates), same load.

Each episode: three turns of a short chat call (tiny model, 4 tokens, over HTTP from the worker)
followed by a tool that waits `--tool-seconds` (an API, a test run). Each worker runs at most
`--worker-concurrency` episodes at once (its slots); the engine admits as many at once as the workers'
slots hold (workers x worker_concurrency), so the workers are the limit. The same 1 + N episodes run with `workers: 1` and `workers: 2` on a local Ray
instance; the first episode of each run warms the workers up and is not timed.

    python benchmarks/ray_scaling.py [--episodes 24] [--tool-seconds 0.3] [--worker-concurrency 2]

Last line: {"ray_2_vs_1": X, "seconds_1_worker": A, "seconds_2_workers": B, ...} (X = A / B).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time

import openai
import ray

from harnessrl.argtypes import at_least
from harnessrl.gateway import BackgroundServer, GatewayClient, create_app
from harnessrl.policy import Policy
from harnessrl.rewards import Reward
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.types import Outcome, Task

ADMIN = "ray-scaling-admin-key"


async def harness(task: Task, llm: openai.AsyncOpenAI) -> Outcome:
    messages = [{"role": "user", "content": task.prompt}]
    for _ in range(3):
        reply = await llm.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        await asyncio.sleep(task.data["tool_seconds"])  # the tool's latency
    return Outcome(answer="done")


async def timed(base_url: str, workers: int, args) -> float:
    config = RolloutConfig(
        backend="ray", workers=workers, worker_concurrency=args.worker_concurrency, concurrency=256, group_size=2
    )
    engine = RolloutEngine(GatewayClient(ADMIN, base_url=base_url), harness, Reward([]), config)
    task = Task(prompt="hello", data={"tool_seconds": args.tool_seconds})
    await asyncio.gather(*(engine.episode(task) for _ in range(workers)))  # warm-up: workers started
    started = time.perf_counter()
    episodes = await asyncio.gather(*(engine.episode(task) for _ in range(args.episodes)))
    seconds = time.perf_counter() - started
    assert all(e.status == "finished" for e in episodes), [e.failure_reason for e in episodes]
    engine.close()
    await engine.gateway.aclose()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=at_least(1), default=24)
    parser.add_argument("--tool-seconds", type=float, default=0.3)
    parser.add_argument("--worker-concurrency", type=at_least(1), default=2)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    policy = Policy.load("tiny")
    with BackgroundServer(create_app(policy, ADMIN)) as server:
        one = asyncio.run(timed(server.base_url, 1, args))
        two = asyncio.run(timed(server.base_url, 2, args))
    policy.close()
    ray.shutdown()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; local Ray, 2 CPUs")
    print(json.dumps({
        "ray_2_vs_1": round(one / two, 2),
        "seconds_1_worker": round(one, 2),
        "seconds_2_workers": round(two, 2),
        "episodes": args.episodes,
        "tool_seconds": args.tool_seconds,
        "worker_concurrency": args.worker_concurrency,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
