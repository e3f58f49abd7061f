"""Training: sequences from recorded calls, group advantages, GRPO-family losses with off-policy
correction, SFT, and resumable Hugging Face checkpoints.

Knows episodes and tensors; knows nothing about HTTP, harnesses or where rewards came from.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harnessrl.train.config import LoraConfig, TrainConfig, lora_for
    from harnessrl.train.sequences import Sequence, episode_sequences
    from harnessrl.train.trainer import Trainer

_EXPORTS = {
    "LoraConfig": "harnessrl.train.config",
    "TrainConfig": "harnessrl.train.config",
    "lora_for": "harnessrl.train.config",
    "Sequence": "harnessrl.train.sequences",
    "episode_sequences": "harnessrl.train.sequences",
    "Trainer": "harnessrl.train.trainer",
}
__all__ = ["LoraConfig", "Sequence", "TrainConfig", "Trainer", "episode_sequences", "lora_for"]


def __getattr__(name: str):
    """Exports load on first use (STYLE.md: heavy libraries lazily): `harnessrl rollback` never imports torch."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
