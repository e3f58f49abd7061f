"""The frozen models a gateway serves beside the trainable policy, chosen by a request's `model`.

A frozen model is either pinned in process (its own copy of a checkpoint, which no weight push
reaches, so its version never changes) or another OpenAI-compatible endpoint the gateway forwards
to. Either way its calls are recorded with `trainable: false` and its name: data, never loss.
A request whose `model` names no frozen model goes to the trainable policy (agents often hard-code
a model name). Knows policies and URLs; nothing about episodes or training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harnessrl.policy import Policy


@dataclass
class Pinned:
    """A frozen checkpoint served in process by its own engine."""

    policy: Policy


@dataclass
class Proxied:
    """A frozen model behind another OpenAI-compatible endpoint (`base_url` ends in /v1).

    `extra_body` goes into every forwarded request: `{"return_token_ids": true}` makes a vLLM server
    return the ids it sampled, which are then recorded; without ids the call is recorded empty."""

    base_url: str
    model: str
    api_key: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeout: float = 600.0


Frozen = Pinned | Proxied


class FrozenSpecError(ValueError):
    """A `--frozen` value that names no model."""


def parse_frozen(spec: str, tool_format: str = "auto") -> tuple[str, Frozen]:
    """`NAME=MODEL` (tiny-base, a preset, a folder or a .gguf, loaded pinned) or `NAME=http(s)://HOST/v1#UPSTREAM`
    (proxied; UPSTREAM, the model name the endpoint knows, defaults to NAME; the key comes from
    $HARNESSRL_FROZEN_API_KEY when set)."""
    import os

    name, sep, source = spec.partition("=")
    if not sep or not name or not source:
        raise FrozenSpecError(f"--frozen {spec!r}: expected NAME=MODEL or NAME=http://HOST/v1#UPSTREAM")
    if source.startswith(("http://", "https://")):
        url, _, upstream = source.partition("#")
        return name, Proxied(url.rstrip("/"), upstream or name, os.environ.get("HARNESSRL_FROZEN_API_KEY"))
    return name, Pinned(Policy.load(source, tool_format=tool_format))
