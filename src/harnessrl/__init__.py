"""harnessrl: train LLM agents with reinforcement learning inside the harness they ship in."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports huggingface_hub: nothing from a hub

from harnessrl.types import Call, Episode, Outcome, RewardBreakdown, Task

__all__ = ["Call", "Episode", "Outcome", "RewardBreakdown", "Task"]
__version__ = "0.1.0"
