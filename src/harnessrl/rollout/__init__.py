"""Async rollout engine: groups per task, concurrency limit, staleness bound, failures as data.

Knows the gateway client, harnesses, rewards and the trainer's step; knows nothing about losses.
"""

from harnessrl.rollout.engine import RolloutConfig, RolloutEngine

__all__ = ["RolloutConfig", "RolloutEngine"]
