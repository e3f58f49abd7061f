"""OpenAI-compatible gateway: per-episode keys, token-exact recording, tool-call parsing.

Knows the policy and episodes; knows nothing about rewards, rollouts or training.
"""

from typing import TYPE_CHECKING

from harnessrl._lazy import exports

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

__getattr__ = exports(__name__, _EXPORTS)
