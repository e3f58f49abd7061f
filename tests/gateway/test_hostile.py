"""Hostile input: every bad request is a 4xx naming its field, and whatever is accepted can be read back."""

import asyncio
import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harnessrl.gateway import BackgroundServer, GatewayClient, create_app
from harnessrl.policy import Policy
from harnessrl.policy.tiny import build_tiny
from harnessrl.types import Episode
from tests.conftest import ADMIN_KEY

HI = [{"role": "user", "content": "hi"}]
LONE = "\ud800"  # a lone surrogate: json.dumps writes it as the escape "\\ud800", which json.loads turns back


def _chat(**extra) -> dict:
    return {"messages": HI, "max_tokens": 1, **extra}


def _tool(**function) -> dict:
    return _chat(tools=[{"type": "function", "function": {"name": "f", **function}}])


def _forged(arguments: str) -> dict:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [*HI, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c", "content": "x"}]
    return {**_tool(parameters={"type": "object"}), "messages": messages}


def _named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def _nested(depth: int) -> dict:
    value: dict | int = 1
    for _ in range(depth):
        value = {"a": value}
    return value


# (route, body, the param the 400 must name): the reproductions of the gateway-hardening issue, one each
REPRODUCTIONS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONE}]}, "messages.0.content"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
        "messages.0.content.0.text",
    ),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": LONE}, *HI]}, "messages.0.content"),
    ("/v1/chat/completions", _tool(description=LONE), "tools.0.function.description"),
    ("/v1/chat/completions", _tool(parameters={"type": "object", "properties": []}), "tools.0.function.parameters"),
    ("/v1/chat/completions", _tool(parameters={"type": "object", "properties": None}), "tools.0.function.parameters"),
    ("/v1/chat/completions", _tool(parameters={"type": "object", "properties": "x"}), "tools.0.function.parameters"),
    ("/v1/chat/completions", _tool(parameters=_nested(700)), "tools.0.function.parameters.a.a.a.a.a.a.a.a.…"),
    ("/v1/chat/completions", _chat(seed=18446744073709551616), "seed"),
    ("/v1/chat/completions", _chat(seed=-9223372036854775809), "seed"),
    ("/v1/chat/completions", _chat(seed=18446744073709551615, n=2), "seed"),
    ("/v1/chat/completions", _chat(max_tokens=10**30), "max_tokens"),
    ("/v1/chat/completions", _chat(stop=["x" * 20_000]), "stop"),  # decoded against at every step: quadratic
    ("/v1/chat/completions", _chat(temperature=float("nan")), "temperature"),
    ("/v1/chat/completions", _chat(metadata={"agent": "x" * 600}), "metadata"),
    ("/v1/chat/completions", _chat(metadata={"agent": LONE}), "metadata.agent"),
    ("/v1/chat/completions", _forged('{"x": "%s"}' % LONE), "messages.1.tool_calls.0.function.arguments"),  # noqa: UP031
    ("/v1/demonstrations", {"messages": HI, "reply": {"role": "assistant", "content": LONE}}, "reply.content"),
    ("/v1/episodes", {"task": {"prompt": LONE}}, "task.prompt"),
    ("/v1/episodes", {"task": {"data": _nested(300)}}, "task.data.a.a.a.a.a.a.a.a.a.a.…"),
    ("/v1/episodes", {"task": {"data": {"x": float("inf")}}}, "task.data.x"),
    ("/v1/episodes", {"agent": LONE}, "agent"),
    # checks of the whole body name the field they check, and a union's member names stay out of the path
    ("/v1/chat/completions", _tool(parameters={}) | {"tool_choice": _named("g")}, "tool_choice.function.name"),
    ("/v1/chat/completions", _chat(tool_choice="required"), "tool_choice"),
    ("/v1/chat/completions", _chat(stop=["x", 1]), "stop.1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 1}]}, "messages.0.content"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "messages.0.content.0.text",
    ),
    ("/v1/demonstrations", {"messages": HI, "reply": {"role": "user", "content": "x"}}, "reply.role"),
    ("/v1/demonstrations", {"messages": HI, "reply": {"role": "assistant", "content": "word " * 5000}}, "reply"),
    # a literal end-of-turn token in the reply would end the recorded turn there, the rest of the reply lost
    (
        "/v1/demonstrations",
        {"messages": HI, "reply": {"role": "assistant", "content": "a <|im_end|> b"}},
        "reply.content",
    ),
    (
        "/v1/demonstrations",
        {
            "messages": HI,
            "reply": {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"x": "<|im_end|>"}'}}],
            },
        },
        "reply.tool_calls.0.function.arguments",
    ),
    ("/v1/episodes/x/feedback", {"signal": "accepted", "value": 0.5}, "value"),
]


async def _post(http: httpx.AsyncClient, path: str, body, key: str = ADMIN_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    return await http.post(path, content=_encode(body), headers=headers)


@pytest.mark.parametrize(("path", "body", "param"), REPRODUCTIONS)
async def test_each_reproduction_is_a_400_naming_its_field(tool_server, path, body, param):
    async with httpx.AsyncClient(base_url=tool_server.base_url) as http:
        key = (await _post(http, "/v1/episodes", {})).json()["api_key"]  # demonstrations need an episode key
        r = await _post(http, path, body, key if path == "/v1/demonstrations" else ADMIN_KEY)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


async def test_a_json_body_sent_without_its_content_type_is_a_400_that_says_so(tool_server):
    async with httpx.AsyncClient(base_url=tool_server.base_url) as http:  # what `curl -d '{...}'` sends
        for kind in ("application/x-www-form-urlencoded", "text/plain", "application/x-ndjson"):
            headers = {"Authorization": f"Bearer {ADMIN_KEY}", "content-type": kind}
            r = await http.post("/v1/chat/completions", content=json.dumps(_chat()), headers=headers)
            assert r.status_code == 400 and r.json()["error"]["code"] == "content_type", r.text
            assert "Content-Type: application/json" in r.json()["error"]["message"] and kind in r.text
        r = await _post(http, "/v1/chat/completions", _chat())
        assert r.status_code == 200, r.text
        wrong_shape = {"Authorization": f"Bearer {ADMIN_KEY}", "content-type": "Application/JSON; charset=utf-8"}
        r = await http.post("/v1/chat/completions", content="[]", headers=wrong_shape)  # JSON, told so: its shape
    assert r.status_code == 400 and r.json()["error"]["code"] != "content_type", r.text


async def test_a_body_json_cannot_read_is_a_json_invalid_400_that_says_why(tool_server):
    chat = b'{"messages": [{"role": "user", "content": "hi"}], '
    bodies = {  # json.loads raises other errors than a syntax error on these
        chat + b'"max_tokens": ' + b"9" * 5000 + b"}": "digits",
        chat + b'"metadata": ' + b"[" * 20_000 + b"1" + b"]" * 20_000 + b"}": "nested too deeply",
        chat + b'"user": "\xff"}': "decode",  # not UTF-8
    }
    async with httpx.AsyncClient(base_url=tool_server.base_url) as http:
        for body, why in bodies.items():
            r = await _post(http, "/v1/chat/completions", body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "json_invalid", r.text
            assert why in r.json()["error"]["message"], r.text


async def test_null_sampling_fields_take_their_defaults_as_in_openais_api(gateway):
    episode_id, key = await gateway.create_episode()
    nulls = {"temperature": None, "top_p": None, "n": None, "logprobs": None, "stream": None}
    r = await gateway.openai(key).chat.completions.create(model="tiny", messages=HI, max_tokens=2, **nulls)
    assert len(r.choices) == 1 and r.choices[0].logprobs is None  # what the API says null means: n 1, no logprobs
    (call,) = (await gateway.episode(episode_id)).calls
    assert (call.temperature, call.top_p, call.trainable) == (1.0, 1.0, True)


async def test_forged_tool_call_arguments_of_any_size_or_depth_are_compared_as_text(tool_server):
    async with httpx.AsyncClient(base_url=tool_server.base_url) as http:
        for arguments in ("1" * 5000, "[" * 3000 + "]" * 3000):
            r = await _post(http, "/v1/chat/completions", _forged(arguments))
            # tiny writes digits one per token: 5,000 of them do not fit its context, which is the only complaint
            assert r.status_code == 200 or r.json()["error"]["code"] == "context_length_exceeded", r.text


async def test_a_refused_finish_changes_nothing_and_a_valid_one_goes_through_once(tool_server):
    async with httpx.AsyncClient(base_url=tool_server.base_url) as http:
        created = (await _post(http, "/v1/episodes", {})).json()
        episode, key = created["id"], created["api_key"]
        finish = f"/v1/episodes/{episode}/finish"
        for body, param in (
            ({"outcome": {"answer": LONE}}, "outcome.answer"),
            ({"failure_reason": LONE, "status": "failed"}, "failure_reason"),
            ({"outcome": {"info": _nested(300)}}, "outcome.info.a.a.a.a.a.a.a.a.a.a.…"),
        ):
            r = await _post(http, finish, body, key)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        r = await http.get(f"/v1/episodes/{episode}", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200 and Episode.from_json(r.text).status == "running"
        assert (await _post(http, finish, {"outcome": {"answer": "ok"}}, key)).status_code == 200
        assert (await _post(http, finish, {"outcome": {"answer": "ok"}}, key)).status_code == 409


# ---- property-based fuzzing over every route ------------------------------------------------------

hostile_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=12) | st.sampled_from(
    ["", "\ud800", "\udfff", "\x00", "<|im_end|>", "<tool_call>", "{{ x }}", "{% raise %}", "\u202e", "a" * 50]
)
numbers = (
    st.integers() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=True, allow_infinity=True)
)
leaves = hostile_text | numbers | st.booleans() | st.none()
free_json = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3), max_leaves=12
)
deep = st.integers(min_value=40, max_value=400).map(_nested)
anything = free_json | deep


def _messages():
    content = (
        hostile_text
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": hostile_text}), max_size=2)
        | anything
    )
    call = st.fixed_dictionaries({
        "id": hostile_text, "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": hostile_text, "arguments": hostile_text | st.just("1" * 5000) | st.just("[" * 2000)}),
    })  # fmt: skip
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "wizard"]), "content": content},
        optional={"tool_calls": st.lists(call, max_size=2), "tool_call_id": hostile_text, "name": hostile_text},
    )
    return st.lists(message, min_size=0, max_size=3)


tools = st.lists(
    st.fixed_dictionaries({
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": hostile_text}, optional={"description": hostile_text, "parameters": anything | st.just({"type": "object", "properties": {"x": {"type": "string"}}})}
        ),
    }),
    max_size=2,
)  # fmt: skip
chat_body = st.fixed_dictionaries(
    {"messages": _messages()},
    optional={
        "tools": tools, "tool_choice": st.sampled_from(["none", "auto", "required"]) | anything,
        "temperature": numbers, "top_p": numbers, "max_tokens": numbers, "n": numbers, "seed": numbers,
        "stop": hostile_text | st.lists(hostile_text, max_size=5), "metadata": anything, "logprobs": leaves,
        "model": leaves, "unknown": leaves,
    },
)  # fmt: skip
episode_body = st.fixed_dictionaries({}, optional={"task": st.fixed_dictionaries({}, optional={"id": leaves, "prompt": leaves, "data": anything, "split": leaves}), "agent": leaves, "trainable": leaves})  # fmt: skip
finish_body = st.fixed_dictionaries({}, optional={"outcome": st.fixed_dictionaries({}, optional={"answer": leaves, "success": leaves, "info": anything}), "status": leaves, "failure_reason": leaves})  # fmt: skip
demo_body = st.fixed_dictionaries({"messages": _messages(), "reply": _messages().map(lambda m: m[0] if m else {})}, optional={"tools": tools})  # fmt: skip
# mostly well-formed requests with hostile text inside, so the fuzz also reaches templating, generation and recording
plausible_chat = st.fixed_dictionaries(
    {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": hostile_text}), min_size=1, max_size=3)},
    optional={
        "tools": st.just([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]),
        "tool_choice": st.sampled_from(["none", "auto", "required"]), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
        "max_tokens": st.integers(1, 3), "n": st.integers(1, 2), "seed": st.integers(-(2**63), 2**63 - 1),
        "stop": st.lists(hostile_text.filter(bool), max_size=2), "logprobs": st.booleans(),
        "metadata": st.dictionaries(st.sampled_from(["agent", "trainable"]), hostile_text, max_size=2),
    },
)  # fmt: skip
plausible_finish = st.fixed_dictionaries(
    {"outcome": st.fixed_dictionaries({"answer": hostile_text, "info": free_json})}
)
plausible_demo = st.fixed_dictionaries({"messages": st.just(HI), "reply": st.fixed_dictionaries({"role": st.just("assistant"), "content": hostile_text})})  # fmt: skip
requests = st.lists(
    st.tuples(st.just("chat"), chat_body | plausible_chat | plausible_chat)
    | st.tuples(st.just("finish"), plausible_finish) | st.tuples(st.just("demo"), plausible_demo) | st.tuples(st.just("episode"), episode_body)
    | st.tuples(st.just("finish"), finish_body) | st.tuples(st.just("demo"), demo_body)
    | st.tuples(st.just("raw"), st.binary(max_size=64)),
    min_size=1, max_size=6,
)  # fmt: skip


@pytest.fixture(scope="module")
def fuzz_app():
    policy = Policy.load("tiny")
    yield create_app(policy, ADMIN_KEY, max_request_bytes=256 * 1024, default_max_tokens=2, finish_wait_seconds=1)
    policy.close()


def _encode(body) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(sequence=requests)
def test_fuzz_no_request_gets_a_5xx_and_every_stored_episode_reads_back(fuzz_app, sequence):
    async def run() -> None:
        transport = httpx.ASGITransport(app=fuzz_app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://fuzz") as http:
            created = await _post(http, "/v1/episodes", {})
            episode, key = created.json()["id"], created.json()["api_key"]
            routes = {"chat": "/v1/chat/completions", "episode": "/v1/episodes", "finish": f"/v1/episodes/{episode}/finish",
                      "demo": "/v1/demonstrations", "raw": "/v1/chat/completions"}  # fmt: skip
            for kind, body in sequence:
                if isinstance(body, dict) and kind == "chat" and isinstance(body.get("max_tokens"), int):
                    body["max_tokens"] = min(
                        max(body["max_tokens"], -5), 3
                    )  # keep generation short; bounds still probed
                who = key if kind in ("finish", "demo") or (kind == "chat" and len(sequence) % 2) else ADMIN_KEY
                headers = {"Authorization": f"Bearer {who}", "content-type": "application/json"}
                r = await http.post(routes[kind], content=_encode(body), headers=headers)
                assert r.status_code < 500, (kind, body, r.text)
                assert "error" in r.json() if r.status_code >= 400 else True, r.text
            listed = await http.get("/v1/episodes", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
            for row in listed.json()["data"]:  # accepted means storable: every episode reads back as a JSON line
                r = await http.get(f"/v1/episodes/{row['id']}", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
                assert r.status_code == 200 and Episode.from_json(r.text).id == row["id"]
                await http.delete(f"/v1/episodes/{row['id']}", headers={"Authorization": f"Bearer {ADMIN_KEY}"})

    asyncio.run(run())


# ---- cancellation and the event loop, over a real socket ------------------------------------------


@pytest.fixture(scope="module")
def plain_server():
    policy = Policy.load("tiny")
    with BackgroundServer(create_app(policy, ADMIN_KEY)) as server:
        yield policy, server
    policy.close()


async def test_a_client_that_disconnects_frees_its_rows_and_records_nothing(plain_server):
    policy, server = plain_server
    client = GatewayClient(ADMIN_KEY, base_url=server.base_url)
    episode, key = await client.create_episode()
    body = {"messages": HI, "max_tokens": 3000, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}) as http:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            await http.post("/v1/chat/completions", json=body, timeout=0.5)
    deadline = time.monotonic() + 10
    while policy.engine.active and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert policy.engine.active == 0  # freed long before 3,000 tokens were sampled
    assert (await client.episode(episode)).calls == []  # a cancelled call is not recorded
    await client.aclose()


async def test_health_answers_while_a_3mb_request_is_tokenised(plain_server):
    _, server = plain_server
    big = json.dumps({"messages": [{"role": "user", "content": "words and more words " * 150_000}]})
    assert len(big) > 3_000_000
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}
        pending = asyncio.ensure_future(http.post("/v1/chat/completions", content=big, headers=headers))
        latencies = []
        while not pending.done():
            started = time.perf_counter()
            assert (await http.get("/health")).status_code == 200
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.02)
        r = await pending
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert len(latencies) >= 5  # the big request took a while, and /health was answered meanwhile
    latencies.sort()
    assert latencies[len(latencies) // 2] < 0.1, latencies  # the median: the event loop was never blocked for long


async def test_a_prompt_token_the_model_cannot_embed_is_a_400_naming_it():
    model, tokenizer = build_tiny()
    tokenizer.add_tokens(["[EXTRA]"])  # added without resizing the embedding: its id is past the rows
    policy = Policy(model, tokenizer, "tiny")
    try:
        transport = httpx.ASGITransport(app=create_app(policy, ADMIN_KEY))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            r = await _post(http, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi [EXTRA]"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
        assert "[EXTRA]" in r.json()["error"]["message"]
    finally:
        policy.close()
