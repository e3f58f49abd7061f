"""An episode's life at its edges: calls racing its finish or its expiry, a trace store that refuses a
write, an expired episode's key, and the lifespan tasks of a gateway on a background server."""

import asyncio
import socket

import httpx
import openai
import pytest
import sqlalchemy as sa

from harnessrl.gateway import BackgroundServer, GatewayClient, GatewayError, create_app
from harnessrl.gateway.models import Proxied
from harnessrl.gateway.serving import DELETED, EXPIRED
from harnessrl.loop.store import Store
from harnessrl.types import Outcome
from tests.conftest import ADMIN_KEY

HI = [{"role": "user", "content": "hi"}]


def _http(app, key: str) -> httpx.AsyncClient:
    """Raw HTTP to the app in process, as an episode's agent."""
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers, timeout=120)


async def _until(condition, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class RefusingStore(Store):
    """The real trace store, refusing its next write of calls (a locked database) when told to."""

    refuse_next = False

    def add_calls(self, episode_id, calls):
        if self.refuse_next:
            self.refuse_next = False
            raise sa.exc.OperationalError("INSERT INTO calls (episode_id, call) VALUES (?, ?)", {}, Exception("locked"))
        super().add_calls(episode_id, calls)

    def get(self, episode_id):
        if self.refuse_next:
            self.refuse_next = False
            raise sa.exc.OperationalError(
                "SELECT episodes.id FROM episodes WHERE episodes.id = ?", {}, Exception("locked")
            )
        return super().get(episode_id)


# ---- calls racing the end of their episode ------------------------------------------------------------------------


async def test_a_call_that_ends_after_its_episode_finished_is_refused_and_recorded_nowhere(policy):
    app = create_app(policy, ADMIN_KEY, finish_wait_seconds=0)  # finish does not wait for calls still generating
    gateway = GatewayClient(ADMIN_KEY, app=app)
    episode_id, key = await gateway.create_episode()
    async with _http(app, key) as http:
        body = {"messages": HI, "max_tokens": 100, "ignore_eos": True}  # seconds: the finish comes first
        pending = asyncio.ensure_future(http.post("/v1/chat/completions", json=body))
        await _until(lambda: app.state.store.get(episode_id).in_flight, "the call to start")
        finished = await gateway.finish(episode_id, Outcome(answer="done"))
        late = await pending
    assert late.status_code == 409 and late.json()["error"]["code"] == "episode_finished", late.text
    assert late.headers["x-should-retry"] == "false"  # the openai client would send it twice more
    # the acknowledged end is the episode: the late call is in neither the finish's reply nor the record
    assert finished.calls == [] and (await gateway.episode(episode_id)).calls == []
    await gateway.aclose()


async def test_finish_and_a_concurrent_call_agree_on_whether_the_call_is_in_the_episode(policy):
    app = create_app(policy, ADMIN_KEY)
    gateway = GatewayClient(ADMIN_KEY, app=app)
    body = {"messages": [{"role": "user", "content": "word " * 300}], "max_tokens": 3}
    for delay in (0, 0.001, 0.003, 0.01):  # the finish lands while the call is parsed, rendered, generating
        episode_id, key = await gateway.create_episode()
        async with _http(app, key) as http:
            pending = asyncio.ensure_future(http.post("/v1/chat/completions", json=body))
            await asyncio.sleep(delay)
            finished = await gateway.finish(episode_id, Outcome(answer="done"))
            call = await pending
        recorded = (await gateway.episode(episode_id)).calls
        # either finish waited for the call (200, in both) or the call came too late (409, in neither)
        assert call.status_code in (200, 409), call.text
        assert len(finished.calls) == len(recorded) == (call.status_code == 200), (delay, call.status_code)
    await gateway.aclose()


async def test_a_session_is_not_expired_under_a_request_still_building_its_prompt(policy):
    app = create_app(policy, ADMIN_KEY, session_ttl=0.3)  # an expiry round every 0.075 s
    async with app.router.lifespan_context(app):
        gateway = GatewayClient(ADMIN_KEY, app=app)
        episode_id, key = await gateway.create_episode()
        big = {"messages": [{"role": "user", "content": "word " * 600_000}]}  # 3 MB: seconds of tokenising
        async with _http(app, key) as http:
            pending = asyncio.ensure_future(http.post("/v1/chat/completions", json=big))
            await asyncio.sleep(0.3 + 0.15)  # idle past the TTL and two rounds, but for this request
            assert not pending.done(), "the request must still be tokenising for this test to mean anything"
            assert (await gateway.episode(episode_id)).status == "running"
            answer = await pending
        assert answer.json()["error"]["code"] == "context_length_exceeded"
        await gateway.aclose()


# ---- a trace store that refuses a write ------------------------------------------------------------------------


async def test_a_call_the_store_refuses_is_taken_back_so_memory_and_store_agree(policy, tmp_path):
    store = RefusingStore(tmp_path / "t.db")
    gateway = GatewayClient(ADMIN_KEY, app=create_app(policy, ADMIN_KEY, recorder=store))
    episode_id, key = await gateway.create_episode()
    llm = gateway.openai(key)
    first = await llm.chat.completions.create(model="tiny", messages=HI, n=2, max_tokens=3, seed=0)
    # the agent goes on from choice 1, which makes it trainable; the store refuses that write
    messages = [*HI, first.choices[1].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    store.refuse_next = True
    with pytest.raises(openai.InternalServerError) as refused:
        await llm.chat.completions.create(model="tiny", messages=messages, max_tokens=3)
    error = refused.value.body
    assert refused.value.status_code == 503 and error["code"] == "store_unavailable", error
    assert "trace store refused the write" in error["message"] and "INSERT" not in error["message"]
    in_memory = await gateway.episode(episode_id)
    assert [c.trainable for c in in_memory.calls] == [False, False]  # the held choice is held again
    assert store.get(episode_id).calls == in_memory.calls
    again = await llm.chat.completions.create(model="tiny", messages=messages, max_tokens=3)  # sent again: recorded
    in_memory = await gateway.episode(episode_id)
    assert [c.trainable for c in in_memory.calls] == [False, True, True] and in_memory.calls[2].extends_call == 1
    assert store.get(episode_id).calls == in_memory.calls
    assert (await gateway.feedback(episode_id, "accepted", call=again.id))["call"] == 2
    await gateway.aclose()
    store.close()


async def test_a_read_the_store_refuses_is_a_503_that_says_so_without_its_sql(policy, tmp_path):
    store = RefusingStore(tmp_path / "t.db")
    with BackgroundServer(create_app(policy, ADMIN_KEY, recorder=store)) as server:
        async with httpx.AsyncClient(
            base_url=server.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        ) as http:
            store.refuse_next = True  # an episode no longer in memory is read from the store
            r = await http.get("/v1/episodes/0123456789abcdef")
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable", r.text
            assert "SELECT" not in r.text
            assert (await http.get("/v1/episodes/0123456789abcdef")).status_code == 404  # read again: not there
    store.close()


async def test_an_episode_deleted_while_running_ends_in_the_store_too(policy, tmp_path):
    store = Store(tmp_path / "t.db")
    gateway = GatewayClient(ADMIN_KEY, app=create_app(policy, ADMIN_KEY, recorder=store))
    episode_id, key = await gateway.create_episode()
    await gateway.openai(key).chat.completions.create(model="tiny", messages=HI, max_tokens=3)
    await gateway.delete(episode_id)  # e.g. a rollout worker died and the attempt is retried
    kept = store.get(episode_id)
    assert (kept.status, kept.failure_reason, len(kept.calls)) == ("failed", DELETED, 1)
    assert store.running() == 0  # not counted as a session still running forever
    with pytest.raises(GatewayError, match="404"):
        await gateway.delete(episode_id)
    with pytest.raises(openai.ConflictError, match="deleted"):  # its key: not "invalid API key"
        await gateway.openai(key).chat.completions.create(model="tiny", messages=HI, max_tokens=3)
    # a call generating when its episode is deleted hears that, not "episode is failed"
    episode_id, key = await gateway.create_episode()
    long = {"model": "tiny", "messages": HI, "max_tokens": 4000, "extra_body": {"ignore_eos": True}}
    call = asyncio.create_task(gateway.openai(key).chat.completions.create(**long))
    await _until(lambda: policy.engine._rows, "the call to be generating")
    await gateway.delete(episode_id)
    with pytest.raises(openai.ConflictError, match="episode is deleted and takes no more calls"):
        await call
    assert len(store.get(episode_id).calls) == 0
    await gateway.aclose()
    store.close()


# ---- expiry --------------------------------------------------------------------------------------------------------


async def test_sessions_expire_and_background_tasks_run_under_a_background_server(policy):
    ran = []

    async def work(app) -> None:
        ran.append(app)

    app = create_app(policy, ADMIN_KEY, session_ttl=0.2, background=[work])
    with BackgroundServer(app) as server:
        gateway = GatewayClient(ADMIN_KEY, base_url=server.base_url)
        episode_id, _ = await gateway.create_episode()
        for _ in range(500):
            if (episode := await gateway.episode(episode_id)).status != "running":
                break
            await asyncio.sleep(0.01)
        await gateway.aclose()
    assert episode.failure_reason == EXPIRED and app.state.store.expired == 1 and ran == [app]


async def test_an_expired_episodes_key_is_told_it_expired_not_that_it_is_invalid(policy, tmp_path):
    store = Store(tmp_path / "t.db")
    app = create_app(policy, ADMIN_KEY, recorder=store, session_ttl=0.2)
    async with app.router.lifespan_context(app):
        gateway = GatewayClient(ADMIN_KEY, app=app)
        episode_id, key = await gateway.create_episode()
        await _until(lambda: app.state.store.get(episode_id) is None, "the episode to leave memory")
        with pytest.raises(openai.ConflictError, match="expired") as ended:
            await gateway.openai(key).chat.completions.create(model="tiny", messages=HI, max_tokens=1)
        assert ended.value.body["code"] == "episode_finished"
        async with _http(app, key) as http:
            assert (await http.post(f"/v1/episodes/{episode_id}/finish", json={})).status_code == 409
        # the admin key reads it from the store; its finish is the 404 the rollout engine takes for "gone"
        assert (await gateway.episode(episode_id)).failure_reason == EXPIRED
        with pytest.raises(GatewayError) as gone:
            await gateway.finish(episode_id)
        assert gone.value.status == 404
        with pytest.raises(openai.AuthenticationError):  # a key it never issued is still a 401
            await gateway.openai("hrl-ep-never-issued").chat.completions.create(model="tiny", messages=HI)
        await gateway.aclose()
    store.close()


# ---- proxied calls -------------------------------------------------------------------------------------------------


async def test_feedback_by_completion_id_reaches_a_proxied_call(swarm_models, tmp_path):
    trainable, pinned = swarm_models
    store = Store(tmp_path / "t.db")
    with BackgroundServer(create_app(pinned, ADMIN_KEY)) as upstream:
        frozen = {"remote": Proxied(upstream.base_url + "/v1", "tiny", api_key=ADMIN_KEY)}
        gateway = GatewayClient(ADMIN_KEY, app=create_app(trainable, ADMIN_KEY, frozen=frozen, recorder=store))
        episode_id, key = await gateway.create_episode()
        reply = await gateway.openai(key).chat.completions.create(model="remote", messages=HI, max_tokens=2)
        assert (await gateway.feedback(episode_id, "accepted", call=reply.id))["call"] == 0
        await gateway.aclose()
    store.close()


async def test_a_client_with_no_gateway_at_its_url_says_where_it_looked():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = GatewayClient(ADMIN_KEY, base_url=f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(GatewayError, match=rf"POST http://127.0.0.1:{port}/v1/episodes: ConnectError") as failed:
            await client.create_episode()
        assert failed.value.status is None
    finally:
        await client.aclose()
