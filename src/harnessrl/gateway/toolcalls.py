"""Parse tool calls out of completion text, in the policy's tool format (`hermes` by default:
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; see `harnessrl.policy.toolformat`).

A malformed call (bad JSON, missing fields, unknown tool, unterminated block) is never an error
of the gateway: the text comes back as plain content and the reason is recorded on the call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from harnessrl.gateway.schema import InputError, check_json
from harnessrl.policy.toolformat import Hermes, ToolFormat


@dataclass
class Parsed:
    content: str | None
    calls: list[tuple[str, str]]  # (name, JSON-encoded arguments)
    error: str | None = None


def parse_tool_calls(text: str, tool_names: set[str], fmt: ToolFormat | None = None) -> Parsed:
    fmt = fmt or Hermes()
    split = fmt.split(text)
    if split.error or not split.blocks:
        return Parsed(text, [], split.error)
    calls = []
    for i, block in enumerate(split.blocks):
        try:
            call = json.loads(block)
            check_json(call)  # the model can write "\\ud800" or NaN too: what is returned must be storable
        except json.JSONDecodeError as exc:
            return Parsed(text, [], f"tool call {i}: bad JSON: {exc.msg} at char {exc.pos}")
        except (ValueError, RecursionError, InputError) as exc:  # 5,000-digit numbers, 3,000-deep nesting
            return Parsed(text, [], f"tool call {i}: bad JSON: {str(exc)[:200]}")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return Parsed(text, [], f"tool call {i}: expected an object with a string 'name'")
        if fmt.args_key not in call and "arguments" not in call and (other := sorted(set(call) - {"name"})):
            return Parsed(text, [], f"tool call {i}: no '{fmt.args_key}', but {other}: the arguments would be lost")
        arguments = call.get(fmt.args_key, call.get("arguments", {}))
        if not isinstance(arguments, dict):
            return Parsed(text, [], f"tool call {i}: '{fmt.args_key}' is not a JSON object")
        if call["name"] not in tool_names:
            return Parsed(text, [], f"tool call {i}: unknown tool {call['name']!r}")
        calls.append((call["name"], json.dumps(arguments, ensure_ascii=False)))
    return Parsed(split.content, calls)
