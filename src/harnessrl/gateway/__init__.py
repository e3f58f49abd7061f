"""OpenAI-compatible gateway: per-episode keys, token-exact recording, tool-call parsing.

Knows the policy and episodes; knows nothing about rewards, rollouts or training.
"""

from harnessrl.gateway.app import create_app
from harnessrl.gateway.client import GatewayClient, GatewayError
from harnessrl.gateway.server import BackgroundServer

__all__ = ["BackgroundServer", "GatewayClient", "GatewayError", "create_app"]
