"""Parse `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks out of completion text.

A malformed call (bad JSON, missing fields, unknown tool, unterminated block) is never an error
of the gateway: the text comes back as plain content and the reason is recorded on the call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from harnessrl.gateway.schema import InputError, check_json

OPEN, CLOSE = "<tool_call>", "</tool_call>"
BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


@dataclass
class Parsed:
    content: str | None
    calls: list[tuple[str, str]]  # (name, JSON-encoded arguments)
    error: str | None = None


def parse_tool_calls(text: str, tool_names: set[str]) -> Parsed:
    if OPEN not in text:
        return Parsed(text, [])
    if text.count(OPEN) != text.count(CLOSE):
        return Parsed(text, [], f"unterminated {OPEN} block")
    calls = []
    for i, block in enumerate(BLOCK.findall(text)):
        try:
            call = json.loads(block)
            check_json(call)  # the model can write "\\ud800" or NaN too: what is returned must be storable
        except json.JSONDecodeError as exc:
            return Parsed(text, [], f"tool call {i}: bad JSON: {exc.msg} at char {exc.pos}")
        except (ValueError, RecursionError, InputError) as exc:  # 5,000-digit numbers, 3,000-deep nesting
            return Parsed(text, [], f"tool call {i}: bad JSON: {str(exc)[:200]}")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return Parsed(text, [], f"tool call {i}: expected an object with a string 'name'")
        arguments = call.get("arguments", {})
        if not isinstance(arguments, dict):
            return Parsed(text, [], f"tool call {i}: 'arguments' is not a JSON object")
        if call["name"] not in tool_names:
            return Parsed(text, [], f"tool call {i}: unknown tool {call['name']!r}")
        calls.append((call["name"], json.dumps(arguments, ensure_ascii=False)))
    content = BLOCK.sub("", text).strip()
    return Parsed(content or None, calls)
