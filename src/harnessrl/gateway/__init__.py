"""OpenAI-compatible gateway: per-episode keys, token-exact recording, tool-call parsing.

Knows the policy and episodes; knows nothing about rewards, rollouts or training.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harnessrl.gateway.app import create_app
    from harnessrl.gateway.client import GatewayClient, GatewayError
    from harnessrl.gateway.server import BackgroundServer

_EXPORTS = {
    "create_app": "harnessrl.gateway.app",
    "GatewayClient": "harnessrl.gateway.client",
    "GatewayError": "harnessrl.gateway.client",
    "BackgroundServer": "harnessrl.gateway.server",
}
__all__ = ["BackgroundServer", "GatewayClient", "GatewayError", "create_app"]


def __getattr__(name: str):
    """Exports load on first use (STYLE.md: heavy libraries lazily): `harnessrl rollback` never imports torch."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
