"""Training: sequences from recorded calls, group advantages, GRPO-family losses with off-policy
correction, SFT, and resumable Hugging Face checkpoints.

Knows episodes and tensors; knows nothing about HTTP, harnesses or where rewards came from.
"""

from typing import TYPE_CHECKING

from harnessrl._lazy import exports

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

__getattr__ = exports(__name__, _EXPORTS)
