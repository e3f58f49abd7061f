"""The gateway over real HTTP on 127.0.0.1, driven by the official openai client."""

import json

import httpx
import openai
import pytest

from harnessrl.gateway import GatewayClient, create_app
from harnessrl.types import Outcome, Task
from tests.conftest import ADMIN_KEY, AGENT_SYSTEM, FOLLOW_UP, WEATHER_TOOLS


def _extends(call, earlier) -> bool:
    head = earlier.prompt_ids + earlier.completion_ids
    return call.prompt_ids[: len(head)] == head


async def _five_turns(client: openai.AsyncOpenAI, temperature: float = 1.0) -> list:
    """An ordinary agent loop: run the tools the model calls, ask follow-ups otherwise."""
    messages = [
        {"role": "system", "content": AGENT_SYSTEM},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    responses = []
    for turn in range(5):
        response = await client.chat.completions.create(
            model="any", messages=messages, tools=WEATHER_TOOLS, max_tokens=40, temperature=temperature, seed=turn
        )
        responses.append(response)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            city = json.loads(call.function.arguments).get("city", "?")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"sunny in {city}"})
        if not message.tool_calls:
            messages.append({"role": "user", "content": FOLLOW_UP})
    return responses


# The three checks below also run on a real model (test_real_model.py).


async def check_five_turn_conversation(gateway: GatewayClient, policy, temperature: float = 1.0) -> None:
    episode_id, key = await gateway.create_episode(Task(id="weather-1", data={"city": "Paris"}))
    responses = await _five_turns(gateway.openai(key), temperature)
    assert any(r.choices[0].finish_reason == "tool_calls" for r in responses)
    assert any(r.choices[0].message.tool_calls is None for r in responses)
    episode = await gateway.episode(episode_id)
    assert episode.task.id == "weather-1" and len(episode.calls) == 5
    for i, call in enumerate(episode.calls):
        assert len(call.sampled_logprobs) == len(call.completion_ids) > 0
        assert call.policy_version == policy.version and call.trainable and call.agent == "main"
        assert responses[i].usage.prompt_tokens == len(call.prompt_ids)
        if i:
            assert call.extends_call == i - 1 and _extends(call, episode.calls[i - 1])
    assert episode.calls[0].extends_call is None
    # the sampled tool call is in the prompt as sampled, not as the template would re-serialise it
    first = episode.calls[0]
    assert policy.decode(first.completion_ids).startswith("<tool_call>")


async def check_edited_history(gateway: GatewayClient, temperature: float = 1.0) -> None:
    episode_id, key = await gateway.create_episode()
    client = gateway.openai(key)
    ask = {"model": "any", "tools": WEATHER_TOOLS, "temperature": temperature}
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    # a whole call, then five tokens of text: two answers that differ (as text too) whatever the model
    for choice, budget in (("required", 30), ("none", 5)):
        r = await client.chat.completions.create(messages=messages, max_tokens=budget, tool_choice=choice, **ask)
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    pruned = [messages[0]] + messages[3:]  # drop the first answer, as a context prune does
    await client.chat.completions.create(messages=pruned, max_tokens=10, **ask)
    edited = messages[:-2] + [{"role": "assistant", "content": "I changed this answer."}, messages[-1]]
    await client.chat.completions.create(messages=edited, max_tokens=10, **ask)
    calls = (await gateway.episode(episode_id)).calls
    assert calls[1].extends_call == 0 and _extends(calls[1], calls[0])
    pruned_call, edited_call = calls[2:]
    assert pruned_call.extends_call is None
    assert not any(_extends(pruned_call, earlier) for earlier in calls[:2])
    # the edited answer was call 1's: the request still extends call 0, whose history is intact
    assert edited_call.extends_call == 0 and _extends(edited_call, calls[0])
    assert not _extends(edited_call, calls[1])


async def check_malformed_call(gateway: GatewayClient, max_tokens: int = 40) -> None:
    episode_id, key = await gateway.create_episode()
    # tool_choice "required" puts <tool_call> in the prompt, so the call is certain to be emitted; a model
    # taught only get_weather writes, under another tool list, an unknown tool or broken JSON (or, in
    # `max_tokens`, an unterminated block)
    other = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    r = await gateway.openai(key).chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=other,
        tool_choice="required",
        temperature=0,
        max_tokens=max_tokens,
    )
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content.startswith("<tool_call>")
    call = (await gateway.episode(episode_id)).calls[0]
    assert (
        call.tool_call_error and call.finish_reason == r.choices[0].finish_reason
    )  # "stop", or "length" when unterminated


async def test_a_five_turn_tool_conversation_is_recorded_token_exactly(gateway, tool_policy):
    await check_five_turn_conversation(gateway, tool_policy)
    assert tool_policy.version == 1


async def test_an_edited_history_starts_a_new_sequence(gateway):
    await check_edited_history(gateway)


async def test_malformed_tool_calls_come_back_as_content_with_a_flag(gateway):
    await check_malformed_call(gateway)


async def test_keys_are_required_and_scoped_to_their_episode(gateway, tool_server):
    first_id, first_key = await gateway.create_episode()
    second_id, second_key = await gateway.create_episode()
    assert first_key != second_key and len(first_key) > 30
    async with httpx.AsyncClient(base_url=tool_server.base_url) as http:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert (await http.post("/v1/chat/completions", json=body, headers=bad)).status_code == 401
        assert (await http.get(f"/v1/episodes/{first_id}", headers=bad)).status_code == 401
        mine = {"Authorization": f"Bearer {first_key}"}
        assert (await http.get(f"/v1/episodes/{first_id}", headers=mine)).status_code == 200
        theirs = await http.get(f"/v1/episodes/{second_id}", headers=mine)
        assert theirs.status_code == 403 and theirs.json()["error"]["type"] == "permission_error"
        finish = await http.post(f"/v1/episodes/{second_id}/finish", json={}, headers=mine)
        assert finish.status_code == 403
        assert (await http.post("/v1/episodes", headers=mine)).status_code == 403
        assert (await http.delete(f"/v1/episodes/{second_id}", headers=mine)).status_code == 403
        assert (await http.get("/health")).json()["status"] == "ok"
    assert (await gateway.episode(second_id)).status == "running"


async def test_bad_requests_get_a_4xx_naming_the_field(gateway, tool_server):
    _, key = await gateway.create_episode()
    headers = {"Authorization": f"Bearer {key}"}
    user = {"role": "user", "content": "hi"}
    cases = [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"messages": [user], "temperature": 3}, "temperature"),
        ({"messages": [user], "temprature": 0.5}, "temprature"),
        ({"messages": []}, "messages"),
        ({"messages": [user], "n": 0}, "n"),
        ({"messages": [user], "stream": True}, "stream"),
        ({"messages": [user], "stream_options": {"include_usage": True}}, "stream_options"),  # as OpenAI and vLLM
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),
        (
            {"messages": [user], "tools": [{"type": "function", "function": {"description": "no name"}}]},
            "tools.0.function.name",
        ),
        ({"messages": [user], "tool_choice": "required"}, "tool_choice"),  # named since 2026-12-06 (was body)
        ({"messages": [user], "metadata": {"trainable": "maybe"}}, "metadata.trainable"),
        ({"messages": [user], "temperature": True}, "temperature"),  # no coercion, as OpenAI's API
        ({"messages": [user], "max_tokens": "3"}, "max_tokens"),
        ({"messages": [user], "logprobs": "yes"}, "logprobs"),
    ]
    async with httpx.AsyncClient(base_url=tool_server.base_url, headers=headers) as http:
        for body, param in cases:
            r = await http.post("/v1/chat/completions", json=body)
            assert r.status_code == 400, (body, r.text)
            error = r.json()["error"]
            assert (error["param"] or "body") == param and error["message"].startswith(param), (body, error)
        r = await http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("body is not valid JSON")
        r = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 70_000}]})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"  # JSON, as every error
        r = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "1 " * 5000}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="temperature"):
        await gateway.openai(key).chat.completions.create(model="tiny", messages=[user], temperature=-1)


async def test_finish_stores_the_outcome_and_closes_the_episode(gateway):
    episode_id, key = await gateway.create_episode()
    client = gateway.openai(key)
    await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    episode = await gateway.finish(episode_id, Outcome(answer="sunny", success=True, info={"turns": 1}))
    assert episode.status == "finished" and episode.outcome.answer == "sunny" and len(episode.calls) == 1
    with pytest.raises(openai.ConflictError):
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    failed_id, _ = await gateway.create_episode()
    failed = await gateway.finish(failed_id, failure_reason="tool crashed: KeyError 'city'")
    assert failed.status == "failed" and failed.failure_reason == "tool crashed: KeyError 'city'"
    await gateway.delete(failed_id)
    with pytest.raises(Exception, match="404"):
        await gateway.episode(failed_id)


async def test_choices_logprobs_stops_and_caller_metadata(gateway):
    episode_id, key = await gateway.create_episode(agent="orchestrator")
    client = gateway.openai(key)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = await client.chat.completions.create(model="tiny", messages=messages, n=3, max_tokens=12, logprobs=True, seed=3)
    await client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, metadata={"agent": "searcher", "trainable": "false"}
    )
    stopped = await client.chat.completions.create(
        model="tiny", messages=messages, tools=WEATHER_TOOLS, tool_choice="none",
        temperature=0, max_tokens=40, stop=['"name"'],
    )  # fmt: skip
    calls = (await gateway.episode(episode_id)).calls
    assert len(r.choices) == 3 and len(calls) == 5
    for choice, call in zip(r.choices, calls):
        assert [t.logprob for t in choice.logprobs.content] == call.sampled_logprobs
        assert call.prompt_ids == calls[0].prompt_ids and call.agent == "orchestrator"
        assert not call.trainable  # n > 1: the siblings must not share the episode's advantage ...
    assert calls[3].agent == "searcher" and not calls[3].trainable
    assert stopped.choices[0].finish_reason == "stop" and '"name"' not in stopped.choices[0].message.content
    assert stopped.choices[0].message.content == "<tool_call>{"
    # ... unless the agent goes on from one of them: that choice becomes trainable, its siblings stay frozen
    kept = r.choices[2].message.model_dump(
        exclude_none=True
    )  # the last: the one extended even if a sibling is identical
    await client.chat.completions.create(
        model="tiny", messages=[*messages, kept, {"role": "user", "content": "ok"}], max_tokens=3
    )
    calls = (await gateway.episode(episode_id)).calls
    assert calls[5].extends_call == 2 and calls[5].trainable
    assert [c.trainable for c in calls[:3]] == [False, False, True]


async def test_both_transports_record_identical_episodes(tool_policy, tool_server):
    app = create_app(tool_policy, ADMIN_KEY)
    episodes = []
    for client in (GatewayClient(ADMIN_KEY, app=app), GatewayClient(ADMIN_KEY, base_url=tool_server.base_url)):
        episode_id, key = await client.create_episode()
        await _five_turns(client.openai(key))
        episodes.append(await client.episode(episode_id))
        await client.aclose()
    in_process, http = episodes
    strip = {"started_at", "ended_at"}
    assert [c.model_dump(exclude=strip) for c in in_process.calls] == [c.model_dump(exclude=strip) for c in http.calls]


async def test_models_lists_the_policy(gateway):
    _, key = await gateway.create_episode()
    models = await gateway.openai(key).models.list()
    assert [m.id for m in models.data] == ["tiny"]


async def test_tool_choice_forces_a_call_and_the_next_turn_still_extends_it(gateway, tool_policy):
    episode_id, key = await gateway.create_episode()
    client = gateway.openai(key)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = await client.chat.completions.create(
        model="tiny", messages=messages, tools=WEATHER_TOOLS, tool_choice=named, temperature=0
    )
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    messages += [
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    r2 = await client.chat.completions.create(
        model="tiny", messages=messages, tools=WEATHER_TOOLS, tool_choice="required", max_tokens=30
    )
    first, second = (await gateway.episode(episode_id)).calls
    named_prefix = tool_policy.encode('<tool_call>{"name": "get_weather", "arguments":')
    assert first.prompt_ids[-len(named_prefix) :] == named_prefix  # forced: in the prompt, so never trained on
    marker = tool_policy.encode("<tool_call>")
    assert second.prompt_ids[-len(marker) :] == marker and second.extends_call == 0 and _extends(second, first)
    assert r2.choices[0].message.tool_calls or second.tool_call_error


async def test_a_next_turn_reports_the_prompt_tokens_its_prefix_cache_reused(tool_policy):
    """usage.prompt_tokens_details.cached_tokens (OpenAI's field): an agent's turn n reuses the KV of turn
    n - 1's prompt and reply (all but the reply's last token, which was never fed); off, nothing is reused."""
    for prefix_cache in (4096, 0):
        tool_policy.engine.prefix_cache = prefix_cache
        client = GatewayClient(ADMIN_KEY, app=create_app(tool_policy, ADMIN_KEY))
        try:
            episode_id, key = await client.create_episode()
            responses = await _five_turns(client.openai(key))
            calls = (await client.episode(episode_id)).calls
        finally:
            tool_policy.engine.prefix_cache = 0
            tool_policy.engine._prefixes.clear()
            await client.aclose()
        cached = [r.usage.prompt_tokens_details.cached_tokens for r in responses]
        if prefix_cache:
            assert [c.extends_call for c in calls[1:]] == [0, 1, 2, 3]
            assert cached == [0] + [len(c.prompt_ids) + len(c.completion_ids) - 1 for c in calls[:-1]]
        else:
            assert cached == [0] * 5


async def test_a_model_is_retrieved_by_name_and_streaming_is_refused_by_name(gateway):
    _, key = await gateway.create_episode()
    client = gateway.openai(key)
    assert (await client.models.retrieve("tiny")).owned_by == "harnessrl"
    with pytest.raises(openai.NotFoundError, match="no model 'gpt-4o': this gateway serves 'tiny'"):
        await client.models.retrieve("gpt-4o")
    with pytest.raises(openai.BadRequestError, match="streaming is not supported") as refused:
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert refused.value.body["param"] == "stream"
    with pytest.raises(openai.BadRequestError, match="only allowed with stream true") as refused:
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream_options={"include_usage": True}
        )
    assert refused.value.body["param"] == "stream_options"


async def test_logprobs_bytes_join_into_the_reply_where_a_character_spans_tokens(policy):
    """The untrained tiny samples byte pieces freely: characters split across tokens, as a real model's non-English
    text is. Each token's `bytes` are its own raw bytes, so the client's join decodes to the reply's text."""
    gateway = GatewayClient(ADMIN_KEY, app=create_app(policy, ADMIN_KEY))
    _, key = await gateway.create_episode()
    r = await gateway.openai(key).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Où est Zürich ?"}], max_tokens=64, logprobs=True, seed=3
    )
    content = r.choices[0].logprobs.content
    assert any(t.token == "\ufffd" for t in content)  # part of a character: the reason `bytes` exists
    raw = b"".join(bytes(t.bytes) for t in content)
    assert "\ufffd".encode() not in raw  # the pieces' own bytes, not the replacement character's
    assert raw.decode(errors="replace") == policy.decode([t.id for t in content])
    await gateway.aclose()
