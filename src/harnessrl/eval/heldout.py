"""Held-out evaluation: run a harness on tasks through the gateway and report its success rate."""

from __future__ import annotations

import asyncio

from harnessrl.gateway import GatewayClient
from harnessrl.harness import Harness
from harnessrl.types import Episode, Task


async def evaluate(gateway: GatewayClient, harness: Harness, tasks: list[Task], concurrency: int = 32, timeout: float = 300.0) -> tuple[float, list[Episode]]:
    """(success rate, episodes); an episode that fails (raises, times out) counts as unsuccessful."""
    slots = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> Episode:
        async with slots:
            episode_id, key = await gateway.create_episode(task)
            try:
                outcome = await asyncio.wait_for(harness(task, gateway.openai(key)), timeout)
                return await gateway.finish(episode_id, outcome)
            except Exception as exc:  # noqa: BLE001 - recorded, counted as a miss
                return await gateway.finish(episode_id, failure_reason=f"{type(exc).__name__}: {exc}")
            finally:
                await gateway.delete(episode_id)

    episodes = list(await asyncio.gather(*(one(t) for t in tasks)))
    wins = sum(bool(e.outcome and e.outcome.success) for e in episodes)
    return wins / max(1, len(episodes)), episodes
