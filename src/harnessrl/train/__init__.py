"""Training: sequences from recorded calls, group advantages, GRPO-family losses with off-policy
correction, SFT, and resumable Hugging Face checkpoints.

Knows episodes and tensors; knows nothing about HTTP, harnesses or where rewards came from.
"""

from harnessrl.train.config import LoraConfig, TrainConfig, lora_for
from harnessrl.train.sequences import Sequence, episode_sequences
from harnessrl.train.trainer import Trainer

__all__ = ["LoraConfig", "Sequence", "TrainConfig", "Trainer", "episode_sequences", "lora_for"]
