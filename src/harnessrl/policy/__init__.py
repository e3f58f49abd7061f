"""The model side: tokenizer + chat template, continuous-batching generation, weight versions.

Knows token ids and text; knows nothing about HTTP, episodes or rewards.
"""

from typing import TYPE_CHECKING

from harnessrl._lazy import exports

if TYPE_CHECKING:
    from harnessrl.policy.engine import Completion, SamplingParams
    from harnessrl.policy.model import Policy
    from harnessrl.policy.sources import PolicyLoadError

_EXPORTS = {
    "Completion": "harnessrl.policy.engine",
    "SamplingParams": "harnessrl.policy.engine",
    "Policy": "harnessrl.policy.model",
    "PolicyLoadError": "harnessrl.policy.sources",
}
__all__ = ["Completion", "Policy", "PolicyLoadError", "SamplingParams"]

__getattr__ = exports(__name__, _EXPORTS)
