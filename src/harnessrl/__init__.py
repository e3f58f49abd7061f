"""harnessrl: train LLM agents with reinforcement learning inside the harness they ship in."""

from harnessrl.types import Call, Episode, Outcome, RewardBreakdown, Task

__all__ = ["Call", "Episode", "Outcome", "RewardBreakdown", "Task"]
__version__ = "0.1.0"
