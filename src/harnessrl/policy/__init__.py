"""The model side: tokenizer + chat template, continuous-batching generation, weight versions.

Knows token ids and text; knows nothing about HTTP, episodes or rewards.
"""

from harnessrl.policy.engine import Completion, SamplingParams
from harnessrl.policy.model import Policy, PolicyLoadError

__all__ = ["Completion", "Policy", "PolicyLoadError", "SamplingParams"]
