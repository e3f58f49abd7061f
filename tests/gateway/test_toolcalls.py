import json

from harnessrl.gateway.toolcalls import parse_tool_calls

NAMES = {"search", "read"}


def test_calls_and_surrounding_text_are_separated():
    text = 'Let me look.<tool_call>{"name": "search", "arguments": {"query": "río"}}</tool_call>\n<tool_call>{"name": "read", "arguments": {"id": 3}}</tool_call>'
    parsed = parse_tool_calls(text, NAMES)
    assert parsed.error is None and parsed.content == "Let me look."
    assert [(n, json.loads(a)) for n, a in parsed.calls] == [("search", {"query": "río"}), ("read", {"id": 3})]


def test_plain_text_passes_through():
    assert parse_tool_calls("just an answer", NAMES).content == "just an answer"


def test_malformed_calls_come_back_as_text_with_a_reason():
    cases = {
        '<tool_call>{"name": "search", "arguments": {"query": }</tool_call>': "tool call 0: bad JSON",
        '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>': "unknown tool 'delete_all'",
        '<tool_call>{"name": "search", "arguments": "q"}</tool_call>': "'arguments' is not a JSON object",
        '<tool_call>["search"]</tool_call>': "expected an object with a string 'name'",
        '<tool_call>{"name": "search", "arguments": {}': "unterminated",
        '<tool_call>{"name": "search", "arguments": {}}}</tool_call>': "tool call 0: text after the call's JSON",
    }
    for text, reason in cases.items():
        parsed = parse_tool_calls(text, NAMES)
        assert parsed.calls == [] and parsed.content == text
        assert reason in parsed.error, parsed.error
