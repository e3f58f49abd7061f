"""The model side: tokenizer + chat template, continuous-batching generation, weight versions.

Knows token ids and text; knows nothing about HTTP, episodes or rewards.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harnessrl.policy.engine import Completion, SamplingParams
    from harnessrl.policy.model import Policy, PolicyLoadError

_EXPORTS = {
    "Completion": "harnessrl.policy.engine",
    "SamplingParams": "harnessrl.policy.engine",
    "Policy": "harnessrl.policy.model",
    "PolicyLoadError": "harnessrl.policy.model",
}
__all__ = ["Completion", "Policy", "PolicyLoadError", "SamplingParams"]


def __getattr__(name: str):
    """Exports load on first use (STYLE.md: heavy libraries lazily): `harnessrl rollback` never imports torch."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
