"""Tool-call formats: how tools are shown to a model and how its calls are read back.

Names follow vLLM's tool-call parsers (`--tool-call-parser`):

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call (Qwen,
  Hermes, SmolLM3, and the project's own tiny models);
- `llama3_json`: the reply is the call itself, `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>`, several joined by `; ` (Llama 3.1-3.3).

A chat template that renders `tools` and assistant `tool_calls` itself is used as it is. For one that
does not (SmolLM2's, most base models'), `adapt` rewrites the conversation before the template sees
it: the tools go into the system turn (one JSON schema a line inside `<tools></tools>`, then how to
call), an assistant turn's calls become its text in the format, and a tool result becomes a user turn
`<tool_response>\n...\n</tool_response>`.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any, Literal, get_args

ToolFormatName = Literal["auto", "hermes", "llama3_json"]  # what a config or --tool-format may name
FORMATS = get_args(ToolFormatName)[1:]
_PROBE = "harnessrl_probe_fn"


@dataclass(frozen=True)
class Split:
    """A reply cut into its text and its raw call objects (JSON text each), or the reason it cannot be."""

    content: str | None
    blocks: list[str]
    error: str | None = None


class ToolFormat:
    name: str
    args_key: str  # what the format calls a call's arguments
    tag: str  # what a forced call starts with (tool_choice "required")

    def split(self, text: str) -> Split:
        raise NotImplementedError

    def call_text(self, name: str, arguments: Any) -> str:
        raise NotImplementedError

    def prefix(self, name: str | None = None, rendered_call: str | None = None) -> str:
        """What the gateway puts in the prompt to force a call (to `name`, when given): the call as
        written (`rendered_call`, the template's rendering of a call to `name` with arguments
        `{"_": 0}`, or this format's) up to its arguments, with no trailing space, so the forced
        tokens are the ones the model writes there."""
        if name is None:
            return self.tag
        written = rendered_call if rendered_call is not None else self.call_text(name, {"_": 0})
        start, end = written.find(self.tag), written.find('{"_"')
        if start < 0 or end < start or f'"{name}"' not in written[start:end]:
            return self.tag  # the template writes calls some other way: force the tag only
        return written[start:end].rstrip()

    def instructions(self, tools: list[dict]) -> str:
        schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        shape = self.call_text("<function-name>", "<arguments-json-object>").replace('"<', "<").replace('>"', ">")
        return (
            f"# Tools\n\nYou may call one or more functions. Their JSON schemas:\n<tools>\n{schemas}\n</tools>\n\n"
            f"To call a function, reply with:\n{shape}"
        )


_DECODER = json.JSONDecoder()


class Hermes(ToolFormat):
    name, args_key, tag = "hermes", "arguments", "<tool_call>"
    OPEN, CLOSE = tag, "</tool_call>"

    def split(self, text: str) -> Split:
        """Each block runs from its open tag through the JSON value after it (read as JSON, so a string holding
        `</tool_call>`, e.g. code, stays whole) to the close tag; a block that is no JSON runs to the next close tag
        and fails as bad JSON when parsed. The last block's close tag may be missing when its JSON is whole and
        only whitespace follows: a stop string `</tool_call>` cut it, or the model ended its turn there."""
        if self.OPEN not in text:
            return Split(text, [])
        blocks, content, at = [], [], 0
        while (start := text.find(self.OPEN, at)) >= 0:
            content.append(text[at:start])
            body = start + len(self.OPEN)
            body += len(text[body:]) - len(text[body:].lstrip())
            try:
                end = _DECODER.raw_decode(text, body)[1]
            except (json.JSONDecodeError, RecursionError):
                end = text.find(self.CLOSE, body)
                if end < 0:
                    return Split(text, [], f"unterminated {self.OPEN} block")
            close = len(text) - len(text[end:].lstrip())
            blocks.append(text[body:end].rstrip())
            if close == len(text):  # the JSON ends the text
                at = close
                break
            if not text.startswith(self.CLOSE, close):  # a stray "}", or words before the close tag
                return Split(text, [], f"tool call {len(blocks) - 1}: text after the call's JSON")
            at = close + len(self.CLOSE)
        content.append(text[at:])
        return Split("".join(content).strip() or None, blocks)

    def call_text(self, name: str, arguments: Any) -> str:
        return f"{self.OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{self.CLOSE}"


class Llama3Json(ToolFormat):
    name, args_key, tag = "llama3_json", "parameters", "{"
    PYTHON_TAG = "<|python_tag|>"
    _DECODER = json.JSONDecoder()
    _SEPARATOR = re.compile(r"\s*;?\s*")

    def split(self, text: str) -> Split:
        body = text.strip()
        if body.startswith(self.PYTHON_TAG):
            body = body[len(self.PYTHON_TAG) :].lstrip()
        elif not body.startswith("{"):
            return Split(text, [])
        blocks, at = [], 0
        while at < len(body):
            try:
                _, end = self._DECODER.raw_decode(body, at)
            except json.JSONDecodeError as exc:
                if blocks and not body.startswith("{", at):  # a stray "}" or words after a call: not a call of its own
                    return Split(text, [], f"tool call {len(blocks) - 1}: text after the call's JSON")
                return Split(text, [], f"tool call {len(blocks)}: bad JSON: {exc.msg} at char {exc.pos}")
            blocks.append(body[at:end])
            at = self._SEPARATOR.match(body, end).end()
        return Split(None, blocks)

    def call_text(self, name: str, arguments: Any) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)


def tool_format(name: str) -> ToolFormat:
    formats = {"hermes": Hermes, "llama3_json": Llama3Json}
    if name not in formats:
        raise ValueError(f"tool format {name!r}: one of {', '.join(FORMATS)}")
    return formats[name]()


# a call object's "name" in either format; an argument called "name" follows a ":", "," or "[", a call never does
# (not `ToolFormat.split`: the trainer needs character offsets and does not know the policy's format)
_CALL_NAME = re.compile(r'(?:^|[^:,\[\s])\s*\{\s*"name"\s*:\s*"([^"]*)"')


def name_tokens(tokenizer, ids: list[int]) -> list[int]:
    """1 on the tokens of a reply (`ids`) that write a tool call's tool name, 0 elsewhere: where an agent
    picks its next action (search again, or answer), the few tokens an episode branches on."""
    marks, tokens = [0] * len(ids), range(len(ids))

    def end(i: int) -> int:  # where token i's text ends
        return len(tokenizer.decode(ids[: i + 1]))

    for m in _CALL_NAME.finditer(tokenizer.decode(ids)):
        a, b = m.span(1)  # from the first token ending past a to the first reaching b, bisected: O(n log n)
        for i in range(bisect_right(tokens, a, key=end), min(bisect_left(tokens, b, key=end) + 1, len(ids))):
            marks[i] = 1
    return marks


def guess_format(chat_template: str) -> str:
    """The format a chat template's own text points at; `hermes` when it says nothing."""
    return "llama3_json" if "<|python_tag|>" in chat_template or "ipython" in chat_template else "hermes"


def renders_tools(render) -> tuple[bool, bool]:
    """Whether a chat template (`render(messages, tools)` -> text) shows the tools it is given, and
    an assistant turn's tool calls."""
    tool = {"type": "function", "function": {"name": _PROBE, "parameters": {"type": "object", "properties": {}}}}
    call = {"id": "c0", "type": "function", "function": {"name": _PROBE + "_call", "arguments": "{}"}}
    user = {"role": "user", "content": "hi"}
    try:
        shows_tools = _PROBE in render([user], [tool])
    except Exception:  # a template that chokes on tools does not render them
        shows_tools = False
    try:
        shows_calls = _PROBE + "_call" in render(
            [user, {"role": "assistant", "content": "", "tool_calls": [call]}], None
        )
    except Exception:  # nor on calls
        shows_calls = False
    return shows_tools, shows_calls


def encodes_arguments(render) -> bool:
    """Whether a chat template that renders calls writes their arguments with `tojson` whatever their type
    (Qwen2.5's, Llama 3.1's): it would quote JSON text once more, so it is given the arguments as objects."""
    arguments = '{"harnessrl_probe": 1}'
    call = {"id": "c0", "type": "function", "function": {"name": _PROBE + "_call", "arguments": arguments}}
    try:
        text = render(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}], None
        )
    except Exception:  # a template that chokes on calls does not render them
        return False
    return json.dumps(arguments) in text


def arguments_as_objects(messages: list[dict]) -> list[dict]:
    """`messages` with each call's arguments parsed from JSON text (text that is not JSON stays text); the caller's
    messages are left as they were."""
    return [{**m, "tool_calls": [_parsed(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]


def _parsed(call: dict) -> dict:
    function = call.get("function") or {}
    if not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def adapt(messages: list[dict], tools: list[dict] | None, fmt: ToolFormat, calls_too: bool) -> list[dict]:
    """The conversation for a template that does not render tools: tools in the system turn and, when
    `calls_too`, calls and results as text (see the module docstring)."""
    out = [_as_text(m, fmt) if calls_too else dict(m) for m in messages]
    if tools:
        text = fmt.instructions(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{text}" if out[0]["content"] else text
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def _as_text(message: dict, fmt: ToolFormat) -> dict:
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"}
    if message["role"] == "assistant" and message.get("tool_calls"):
        shown = [
            fmt.call_text(c["function"]["name"], _arguments(c["function"]["arguments"])) for c in message["tool_calls"]
        ]
        return {"role": "assistant", "content": "\n".join(filter(None, [message.get("content") or "", *shown]))}
    return dict(message)


def _arguments(arguments: Any) -> Any:
    """A call's arguments as the JSON value they encode (as given when they are not JSON)."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
