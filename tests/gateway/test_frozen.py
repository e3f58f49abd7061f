"""Several models behind one gateway, and the call tree: frozen calls recorded untrainable at a fixed
version, sub-agent calls placed under the call that spawned them, never inside the orchestrator's chain."""

import asyncio

import openai
import pytest

from harnessrl.calltree import critical_steps
from harnessrl.gateway import BackgroundServer, GatewayClient, create_app
from harnessrl.gateway.models import FrozenSpecError, Pinned, Proxied, parse_frozen
from harnessrl.policy import Policy
from harnessrl.policy.engine import SamplingParams
from harnessrl.train.sequences import episode_sequences
from tests.conftest import ADMIN_KEY

SYSTEM = {"role": "system", "content": "You are an orchestrator."}


async def _ask(llm: openai.AsyncOpenAI, model: str, messages: list[dict], **metadata: str):
    return await llm.chat.completions.create(
        model=model, messages=messages, max_tokens=8, seed=0, metadata=metadata or None
    )


async def test_frozen_calls_are_untrainable_at_a_version_no_push_changes(swarm_gateway, swarm_models):
    trainable, pinned = swarm_models
    listed = await swarm_gateway._request("GET", "/v1/models")
    assert [m["id"] for m in listed["data"]] == ["tiny", "sub"]
    episode_id, key = await swarm_gateway.create_episode()
    llm = swarm_gateway.openai(key)
    for update in range(3):
        await _ask(llm, "gpt-4o", [SYSTEM, {"role": "user", "content": f"go {update}"}])  # any other name: trainable
        response = await _ask(llm, "sub", [{"role": "user", "content": f"work {update}"}], agent="worker")
        assert response.model == "sub"
        trainable.update_weights(trainable.model.state_dict())  # a weight push after every round
    episode = await swarm_gateway.episode(episode_id)
    main, sub = episode.calls[0::2], episode.calls[1::2]
    assert [c.policy_version - main[0].policy_version for c in main] == [0, 1, 2] and all(
        c.trainable and c.model is None for c in main
    )
    assert {c.policy_version for c in sub} == {pinned.version} and pinned.version == 0
    assert all(not c.trainable and c.model == "sub" and c.agent == "worker" for c in sub)


async def test_sub_agents_hang_under_their_parent_and_never_break_the_orchestrator_chain(swarm_gateway):
    episode_id, key = await swarm_gateway.create_episode()
    llm = swarm_gateway.openai(key)
    messages = [SYSTEM, {"role": "user", "content": "Find three facts."}]
    first = await _ask(llm, "tiny", messages)
    for k in range(3):  # three sub-agents spawned by the first call, one of them on the trainable policy
        model, talk = "tiny" if k == 0 else "sub", [{"role": "user", "content": f"task {k}"}]
        for _ in range(2):  # a two-step conversation of its own
            reply = await _ask(llm, model, talk, agent="w", lineage=f"w/{k}", parent=first.id)
            talk += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "results: ..."}]
    await _ask(llm, "tiny", messages)
    episode = await swarm_gateway.episode(episode_id)
    assert [c.parent_call for c in episode.calls] == [None] + [0] * 6 + [None]
    assert [c.lineage for c in episode.calls[1:3]] == ["w/0", "w/0"]
    assert episode.calls[-1].extends_call == 0  # the orchestrator's chain survives six calls in between
    assert critical_steps(episode.calls) == 1 + 2 + 1 and len(episode.calls) == 8
    sequences = episode_sequences(episode)
    assert [s.calls for s in sequences] == [[0, 7], [1, 2]]  # the frozen sub-agents carry no loss: dropped


async def test_a_bad_parent_is_a_400_naming_the_key(swarm_gateway):
    _, key = await swarm_gateway.create_episode()
    llm = swarm_gateway.openai(key)
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="metadata.parent: not the id of a chat completion"):
        await _ask(llm, "tiny", user, parent="chatcmpl-nope")
    await _ask(llm, "tiny", user, session="s-1")  # the agent's own metadata keys are allowed (OpenAI's) and ignored
    first = await _ask(llm, "tiny", user)
    await _ask(llm, "sub", user, lineage="w/0", parent=first.id)
    with pytest.raises(openai.BadRequestError, match="lineage 'w/0' was spawned by call 1, not None"):
        await _ask(llm, "sub", user, lineage="w/0")
    too_long = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(openai.BadRequestError, match="context"):  # fails: nothing of lineage w/1 is recorded
        await _ask(llm, "tiny", too_long, lineage="w/1", parent=first.id)
    await _ask(llm, "tiny", user, lineage="w/1")  # so a retry may begin it under another parent (here none)


async def test_a_sub_agent_names_which_choice_of_n_spawned_it(swarm_gateway):
    episode_id, key = await swarm_gateway.create_episode()
    llm = swarm_gateway.openai(key)
    user = [{"role": "user", "content": "plan"}]
    three = await llm.chat.completions.create(model="tiny", messages=user, max_tokens=4, n=3)
    await _ask(llm, "sub", user, lineage="w/a", parent=three.id, parent_choice="2")
    await _ask(llm, "sub", user, lineage="w/b", parent=three.id)  # choice 0 unless named
    for choice, error in [("3", r"'3' is not a choice of chatcmpl-\w+ \(0..2\)"), ("-1", "'-1' is not a choice")]:
        with pytest.raises(openai.BadRequestError, match=error):
            await _ask(llm, "sub", user, lineage="w/c", parent=three.id, parent_choice=choice)
    with pytest.raises(openai.BadRequestError, match="metadata.parent_choice: names a choice of metadata.parent"):
        await _ask(llm, "sub", user, lineage="w/c", parent_choice="1")
    episode = await swarm_gateway.episode(episode_id)
    assert [c.parent_call for c in episode.calls] == [None, None, None, 2, 0]


async def test_a_proxied_frozen_model_is_recorded_and_a_dead_one_is_a_502(swarm_models):
    trainable, pinned = swarm_models
    with BackgroundServer(create_app(pinned, ADMIN_KEY)) as upstream:
        frozen = {
            "remote": Proxied(upstream.base_url + "/v1", "tiny", api_key=ADMIN_KEY),
            "dead": Proxied("http://127.0.0.1:9/v1", "x"),
            "locked": Proxied(upstream.base_url + "/v1", "tiny", api_key="not-the-upstreams-key"),
        }
        gateway = GatewayClient(ADMIN_KEY, app=create_app(trainable, ADMIN_KEY, frozen=frozen))
        try:
            episode_id, key = await gateway.create_episode()
            llm = gateway.openai(key)
            response = await _ask(llm, "remote", [{"role": "user", "content": "hello"}], agent="scout")
            assert response.choices[0].message.content is not None
            with pytest.raises(openai.APIStatusError, match="model 'dead': http://127.0.0.1:9/v1 failed") as error:
                await _ask(llm, "dead", [{"role": "user", "content": "hello"}])
            assert error.value.status_code == 502
            # the upstream refusing the gateway's key is not the agent's key being wrong (a 401 to the agent)
            with pytest.raises(openai.APIStatusError, match="model 'locked': .* answered 401") as error:
                await _ask(llm, "locked", [{"role": "user", "content": "hello"}])
            assert error.value.status_code == 502 and error.value.body["code"] == "upstream_error"
            episode = await gateway.episode(episode_id)
        finally:
            await gateway.aclose()
    assert len(episode.calls) == 1
    call = episode.calls[0]
    assert call.model == "remote" and call.agent == "scout" and not call.trainable and call.policy_version == 0


def test_frozen_specs():
    name, frozen = parse_frozen("search=http://10.0.0.2:8000/v1/#Qwen/Qwen3-8B")
    assert name == "search" and frozen == Proxied("http://10.0.0.2:8000/v1", "Qwen/Qwen3-8B")
    assert parse_frozen("w=https://h/v1")[1].model == "w"
    pinned = parse_frozen("w=tiny", cache=3)[1]
    assert pinned.cache == 3 and pinned.policy.name == "tiny"
    pinned.policy.close()
    with pytest.raises(FrozenSpecError, match="expected NAME=MODEL"):
        parse_frozen("search")
    with pytest.raises(ValueError, match="has the trainable policy's name"):
        create_app(Policy.load("tiny"), ADMIN_KEY, frozen={"tiny": Proxied("http://x/v1", "y")})


async def test_a_pinned_models_greedy_repeats_share_one_generation(swarm_models):
    frozen = Pinned(swarm_models[1], cache=2)
    client = GatewayClient(ADMIN_KEY, app=create_app(swarm_models[0], ADMIN_KEY, frozen={"sub": frozen}))
    keys = [(await client.create_episode()) for _ in range(3)]

    async def ask(key: str, content: str, temperature: float = 0.0):
        llm = client.openai(key)
        messages = [{"role": "user", "content": content}]
        return await llm.chat.completions.create(model="sub", messages=messages, max_tokens=12, temperature=temperature)

    replies = await asyncio.gather(*(ask(key, "same question") for _, key in keys))  # in flight together
    assert frozen.hits == 2 and len({r.choices[0].message.content for r in replies}) == 1
    # the two repeats computed nothing of their prompt; the one generation prefilled it all (no prefix cache)
    cached = sorted(r.usage.prompt_tokens_details.cached_tokens for r in replies)
    assert cached == [0, replies[0].usage.prompt_tokens, replies[0].usage.prompt_tokens]
    episodes = [await client.episode(episode_id) for episode_id, _ in keys]
    calls = [e.calls[0] for e in episodes]  # each episode records its own call, not a shared list
    assert calls[0].completion_ids == calls[1].completion_ids and calls[0].completion_ids is not calls[1].completion_ids
    direct = swarm_models[1].engine.generate_sync(calls[0].prompt_ids, SamplingParams(temperature=0.0, max_tokens=12))
    assert calls[0].completion_ids == direct.ids  # what the engine makes greedily for that prompt
    await ask(keys[0][1], "same question", temperature=1.0)  # sampled: never shared
    await ask(keys[0][1], "another")
    await ask(keys[0][1], "a third")  # two kept: "same question" is forgotten
    await ask(keys[1][1], "same question")
    assert frozen.hits == 2
    await ask(keys[2][1], "a third")
    assert frozen.hits == 3
    await client.aclose()


async def test_a_shared_generation_is_cancelled_when_its_last_caller_goes(swarm_models):
    frozen = Pinned(swarm_models[1], cache=8)
    params = SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True)
    callers = [asyncio.ensure_future(frozen.generate([5, 6, 7], params)) for _ in range(2)]
    await asyncio.sleep(0.2)
    callers[0].cancel()
    await asyncio.sleep(0.2)
    (shared,) = frozen._kept.values()
    assert not shared.task.done()  # one caller still waits: the generation goes on
    callers[1].cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    await asyncio.sleep(0.1)
    assert shared.task.cancelled() and not frozen._kept  # given up and forgotten: the next request generates
    again = await frozen.generate([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4))
    assert len(again[0].ids) == 4 and frozen.hits == 1  # generated anew (the one hit: the second caller joining)
