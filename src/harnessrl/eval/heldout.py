"""Held-out evaluation: run a harness on tasks through the gateway and report its success rate."""

from __future__ import annotations

import asyncio

from harnessrl.gateway import GatewayClient
from harnessrl.harness import Harness
from harnessrl.rewards import Reward
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.types import Episode, Task

# an episode's wall-clock limit when evaluating (the job's held-out and validation runs, `harnessrl eval`):
# longer than training's, since 32 episodes in flight on 2 cores can take minutes and a timeout is a failure
HELDOUT_TIMEOUT = 300.0


async def evaluate(
    gateway: GatewayClient, harness: Harness, tasks: list[Task], concurrency: int = 32, timeout: float = HELDOUT_TIMEOUT
) -> tuple[float, list[Episode]]:
    """(success rate, episodes); an episode that fails (raises, times out) counts as unsuccessful.

    Episodes run exactly as in training (the rollout engine's `episode`), one per task, unscored.
    """
    engine = RolloutEngine(
        gateway, harness, Reward([]), RolloutConfig(concurrency=concurrency, episode_timeout=timeout)
    )
    episodes = list(await asyncio.gather(*(engine.episode(t) for t in tasks)))
    wins = sum(e.succeeded for e in episodes)
    return wins / max(1, len(episodes)), episodes
