"""The frozen models a gateway serves beside the trainable policy, chosen by a request's `model`.

A frozen model is either pinned in process (its own copy of a checkpoint, which no weight push
reaches, so its version never changes) or another OpenAI-compatible endpoint the gateway forwards
to. Either way its calls are recorded with `trainable: false` and its name: data, never loss.
A request whose `model` names no frozen model goes to the trainable policy (agents often hard-code
a model name). Knows policies and URLs; nothing about episodes or training.

A pinned model's greedy reply is a function of its prompt (the weights never change), so with
`cache` > 0 its greedy completions are kept (the `cache` most recent prompts) and a repeat, or an
identical request still in flight, is answered from the one generation: the G episodes of a GRPO
group hand their sub-agents the same questions, and the same turns follow. A repeat is recorded as
a call like any other, with the ids and logprobs of that generation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from harnessrl.policy import Policy
from harnessrl.policy.engine import Completion, SamplingParams


@dataclass
class Pinned:
    """A frozen checkpoint served in process by its own engine."""

    policy: Policy
    cache: int = 0  # greedy completions kept; 0 generates every request
    hits: int = field(default=0, init=False)  # requests answered from another's generation
    _kept: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False)  # key -> _Shared

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Completion]:
        """The engine's completions; a greedy repeat (with `cache`) gets copies of the one generation's."""
        if not self.cache or params.temperature > 0:
            return await self.policy.engine.generate(prompt_ids, params, n)
        key = (tuple(prompt_ids), params.max_tokens, tuple(params.stop), params.ignore_eos, n)
        shared = self._kept.get(key)
        if hit := shared is not None and shared.usable():
            self._kept.move_to_end(key)
            self.hits += 1
        else:
            shared = self._kept[key] = _Shared(
                asyncio.ensure_future(self.policy.engine.generate(prompt_ids, params, n))
            )
            shared.task.add_done_callback(functools.partial(self._forget_failed, key))
            while len(self._kept) > self.cache:
                self._kept.popitem(last=False)
        done = await shared.wait()
        cached = {"cached_tokens": len(prompt_ids)} if hit else {}  # a repeat: nothing of its prompt was computed
        return [dataclasses.replace(c, ids=list(c.ids), logprobs=list(c.logprobs), **cached) for c in done]

    def _forget_failed(self, key: tuple, task: asyncio.Task) -> None:
        """A generation that failed or was given up is not kept: the next request generates again."""
        shared = self._kept.get(key)
        if shared is not None and shared.task is task and (task.cancelled() or task.exception() is not None):
            del self._kept[key]


@dataclass
class _Shared:
    """One generation awaited by every identical request; cancelled only when all of them go away."""

    task: asyncio.Task
    waiting: int = 0
    given_up: bool = False  # cancelled by its last caller (the task may not have stopped yet)

    def usable(self) -> bool:
        return self.task.get_loop() is asyncio.get_running_loop() and not self.given_up and not self.task.cancelled()

    async def wait(self) -> list[Completion]:
        self.waiting += 1
        try:
            return await asyncio.shield(self.task)
        except asyncio.CancelledError:
            if self.waiting == 1 and not self.task.done():  # the last one waiting: free the engine's rows
                self.given_up = True
                self.task.cancel()
            raise
        finally:
            self.waiting -= 1


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


def parse_frozen(spec: str, tool_format: str = "auto", cache: int = 0) -> tuple[str, Frozen]:
    """`NAME=MODEL` (tiny-base, a preset, a folder or a .gguf, loaded pinned) or `NAME=http(s)://HOST/v1#UPSTREAM`
    (proxied; UPSTREAM, the model name the endpoint knows, defaults to NAME; the key comes from
    $HARNESSRL_FROZEN_API_KEY when set). `cache`: a pinned model's kept greedy completions."""
    import os

    name, sep, source = spec.partition("=")
    if not sep or not name or not source:
        raise FrozenSpecError(f"--frozen {spec!r}: expected NAME=MODEL or NAME=http://HOST/v1#UPSTREAM")
    if source.startswith(("http://", "https://")):
        url, _, upstream = source.partition("#")
        return name, Proxied(url.rstrip("/"), upstream or name, os.environ.get("HARNESSRL_FROZEN_API_KEY"))
    return name, Pinned(Policy.load(source, tool_format=tool_format), cache)
