"""Token-exact prompts: reuse the ids an episode already sampled instead of retokenising text.

An agent sends its whole history back on every turn. Rendering that history with the chat template
and tokenising it again would not give back the ids the policy sampled (tool calls are re-serialised,
BPE merges differ across boundaries, stop strings were cut), and the trainer would learn on tokens
the model never produced. So when a request's messages begin with an earlier call's messages
followed by the assistant message that call returned, the prompt is

    earlier prompt ids + earlier completion ids + ids of (end of that turn + the new messages)

where the text after the assistant turn comes from the chat template itself: the history is rendered
with a sentinel in place of the assistant turn, and only what follows the sentinel is tokenised.
If anything does not line up (history edited, a template that rewrites earlier turns) the prompt is
rendered fresh and the call starts a new sequence — never a silent misalignment.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from jinja2 import TemplateError

from harnessrl.gateway.schema import Message
from harnessrl.policy import Policy
from harnessrl.types import Call

# letters and a random hex tag only: templates render content | trim (Llama 3, Gemma), and Python's and Jinja's
# trim strip \x1f-style control characters as whitespace, so a stand-in holding any would lose its ends
_SENTINEL = "HarnessrlAssistantTurn" + secrets.token_hex(8)
# what a chat template raises on data it cannot render (jinja errors, filters given the wrong type, ...)
TEMPLATE_ERRORS = (TemplateError, TypeError, ValueError, KeyError, AttributeError, RecursionError)


class PromptError(ValueError):
    """The model's chat template cannot render this request (a 400, not a 500)."""


@dataclass
class Turn:
    """What the gateway remembers of one recorded call so a later request can extend it."""

    messages: list[tuple]  # Message.identity() of each request message
    tools_key: str
    prompt_text: str  # the rendered request (with generation prompt), before any forced prefix
    assistant: tuple  # identity of the assistant message this call returned
    thread: tuple[str, str | None] = ("main", None)  # (lineage, frozen model): only the same thread extends it


@dataclass
class Prompt:
    ids: list[int]
    text: str  # the fresh rendering of the request
    extends_call: int | None = None
    tools_key: str = ""
    identities: list[tuple] = field(default_factory=list)


def build_prompt(
    policy: Policy,
    messages: list[Message],
    tools: list[dict] | None,
    calls: list[Call],
    turns: list[Turn],
    thread: tuple[str, str | None] = ("main", None),
) -> Prompt:
    """The request's prompt ids, reusing those of an earlier call of the same `thread` (one agent's
    conversation on one model) when the request extends it."""
    dicts = [m.for_template() for m in messages]
    try:
        text = policy.render(dicts, tools, generation_prompt=True)
    except TEMPLATE_ERRORS as exc:
        raise PromptError(f"the chat template cannot render this request: {type(exc).__name__}: {exc}") from None
    prompt = Prompt([], text, None, json.dumps(tools, sort_keys=True), [m.identity() for m in messages])
    for index in _candidates(prompt, turns, thread):
        ids = _extend(policy, dicts, tools, calls[index], turns[index])
        if ids is not None:
            prompt.ids, prompt.extends_call = ids, index
            return prompt
    prompt.ids = policy.encode(text)
    return prompt


def _candidates(prompt: Prompt, turns: list[Turn], thread: tuple[str, str | None]) -> list[int]:
    """Earlier calls of the thread whose messages + returned assistant message begin this request; longest first."""
    found = []
    for index, turn in enumerate(turns):
        m = len(turn.messages)
        if (
            turn.thread == thread
            and turn.tools_key == prompt.tools_key
            and len(prompt.identities) > m
            and prompt.identities[:m] == turn.messages
            and prompt.identities[m] == turn.assistant
        ):
            found.append(index)
    return sorted(found, key=lambda i: (len(turns[i].messages), i), reverse=True)


def _extend(policy: Policy, dicts: list[dict], tools: list[dict] | None, call: Call, turn: Turn) -> list[int] | None:
    m = len(turn.messages)
    stand_in = {"role": "assistant", "content": _SENTINEL}
    try:
        before = policy.render(dicts[:m] + [stand_in], tools, generation_prompt=False)
        after = policy.render(dicts[:m] + [stand_in] + dicts[m + 1 :], tools, generation_prompt=True)
    except TEMPLATE_ERRORS:
        return None  # the template refuses the stand-in turn: render fresh, a new sequence
    head = turn.prompt_text + _SENTINEL
    if not before.startswith(head) or not after.startswith(before):
        return None  # the template renders this history differently: start a new sequence
    closing = before[len(head) :]  # the template's end of that turn: "<|im_end|>\n", or "\n<|im_end|>\n", ...
    if call.completion_ids and call.completion_ids[-1] in policy.eos_ids:
        # the model sampled its end-of-turn token: it stands for the closing up to and including that token
        eos = policy.decode(call.completion_ids[-1:])
        if (cut := closing.find(eos)) >= 0:
            closing = closing[cut + len(eos) :]
    return call.prompt_ids + call.completion_ids + policy.encode(closing + after[len(before) :])
