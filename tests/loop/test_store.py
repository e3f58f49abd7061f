"""The trace store against SQLite and a real PostgreSQL: round trip, idempotent late feedback, expiry, windows."""

from __future__ import annotations

import re
import sqlite3
import threading
import time

import pytest

from harnessrl.gateway.serving import EXPIRED
from harnessrl.loop.store import Store, StoreError
from harnessrl.types import Call, Episode, Outcome, Task
from tests.conftest import cli


def _call(version: int, n: int = 3) -> Call:
    return Call(
        prompt_ids=[1, 2, 3], completion_ids=list(range(n)), sampled_logprobs=[-0.5] * n, policy_version=version
    )


def _episode(store: Store, calls: int = 2, version: int = 1) -> Episode:
    episode = Episode(task=Task(prompt="q", data={"city": "Oslo"}))
    store.add_episode(episode, "weather", version)
    store.add_calls(episode.id, [(i, _call(version, i + 2), f"chatcmpl-{episode.id[:6]}-{i}") for i in range(calls)])
    return episode


def test_round_trip_is_token_exact(store_url):
    store = Store(store_url)
    episode = _episode(store)
    finished = episode.model_copy(update={"status": "finished", "outcome": Outcome(answer="sunny")})
    store.finish(finished)
    (row,) = store.episodes(model="weather")
    assert row.episode.status == "finished" and row.episode.outcome.answer == "sunny"
    assert [c.completion_ids for c in row.episode.calls] == [[0, 1], [0, 1, 2]]
    assert row.episode.calls[1].sampled_logprobs == [-0.5] * 3 and row.policy_version == 1
    assert store.get(episode.id).task.data == {"city": "Oslo"}
    assert store.episodes(model="other") == []
    store.close()


def test_a_failure_reason_holding_nul_is_stored(store_url):
    """An exception's message may hold NUL (a crashing tool's output); PostgreSQL's text cannot: written escaped there."""
    store = Store(store_url)
    episode = _episode(store)
    store.finish(episode.model_copy(update={"status": "failed", "failure_reason": "ToolError: a\x00b"}))
    stored = "ToolError: a\\x00b" if store.engine.dialect.name == "postgresql" else "ToolError: a\x00b"
    assert store.get(episode.id).failure_reason == stored
    store.close()


def test_feedback_is_idempotent_and_joined_by_call(store_url):
    store = Store(store_url)
    episode = _episode(store, calls=3)
    assert store.add_feedback(episode.id, None, "accepted", None) == 2  # None: the last call
    assert store.add_feedback(episode.id, None, "accepted", None) == 2  # again: nothing changes
    assert store.add_feedback(episode.id, f"chatcmpl-{episode.id[:6]}-0", "scalar", 0.5) == 0  # by response id
    store.add_feedback(episode.id, 2, "rejected", None)  # a later signal for the same call replaces it
    (row,) = store.episodes()
    assert sorted((f.call_index, f.signal, f.value) for f in row.feedback) == [
        (0, "scalar", 0.5),
        (2, "rejected", None),
    ]
    with pytest.raises(StoreError, match="call: episode .* has calls 0..2, not 7"):
        store.add_feedback(episode.id, 7, "accepted", None)
    with pytest.raises(StoreError, match="no chat completion 'chatcmpl-nope'"):
        store.add_feedback(episode.id, "chatcmpl-nope", "accepted", None)
    with pytest.raises(StoreError, match="no episode 'missing'"):
        store.add_feedback("missing", None, "accepted", None)
    nul = "a\x00b"  # PostgreSQL's text holds no NUL: no such episode, not an SQL error
    with pytest.raises(StoreError, match=re.escape(f"no episode {nul!r}")):
        store.add_feedback(nul, None, "accepted", None)
    assert store.get(nul) is None
    store.close()


def test_a_rerecorded_call_keeps_its_response_id(store_url):
    store = Store(store_url)
    episode = _episode(store, calls=1)
    changed = _call(1, 2).model_copy(update={"trainable": False})
    store.add_calls(episode.id, [(0, changed, None)])
    assert store.get(episode.id).calls[0].trainable is False
    assert store.add_feedback(episode.id, f"chatcmpl-{episode.id[:6]}-0", "accepted", None) == 0
    store.close()


def test_idle_sessions_expire_and_windows_select_by_creation_or_end(store_url):
    store = Store(store_url)
    old = _episode(store)
    cut = time.time()
    time.sleep(0.05)
    new = _episode(store)
    assert store.expire(ttl_seconds=3600, model="weather") == [] and store.running("weather") == 2
    assert store.episodes(ended=True) == []  # running: in no window yet
    store.finish(old.model_copy(update={"status": "finished"}))  # created before the cut, ended after it
    assert [r.episode.id for r in store.episodes(since=cut, ended=True)] == [old.id] and store.running() == 1
    assert store.expire(ttl_seconds=0.0, model="weather", now=time.time() + 1) == [new.id]
    (expired,) = [r.episode for r in store.episodes() if r.episode.id == new.id]
    assert expired.failure_reason == EXPIRED
    assert [r.episode.id for r in store.episodes(since=cut)] == [new.id]
    assert [r.episode.id for r in store.episodes(until=cut)] == [old.id]
    assert {r.episode.id for r in store.episodes(since=cut, ended=True)} == {old.id, new.id}
    assert store.episodes(until=cut, ended=True) == []
    late = _episode(store)  # idle, expired long after its TTL ran out: it ended when the TTL did
    last = time.time()  # just after its last activity
    assert store.expire(ttl_seconds=60.0, model="weather", now=last + 3600) == [late.id]
    assert [r.episode.id for r in store.episodes(since=last + 60.5, ended=True)] == []
    assert late.id in [r.episode.id for r in store.episodes(since=last - 1, until=last + 60.5, ended=True)]
    store.add_calls(old.id, [(5, _call(1), None)])  # a call that lands after the end does not move it
    assert old.id not in [r.episode.id for r in store.episodes(since=time.time() - 0.01, ended=True)]
    store.close()


def test_an_ended_episode_stays_ended_and_expiry_keeps_to_its_model(store_url):
    store = Store(store_url)
    episode, theirs = _episode(store), Episode(task=Task(prompt="q"))
    store.add_episode(theirs, "billing", 1)  # another registry's session in the same store
    assert store.expire(ttl_seconds=0.0, model="weather", now=time.time() + 1) == [episode.id]
    assert store.get(theirs.id).status == "running"  # its own cycle expires it, with its own TTL
    late = episode.model_copy(update={"status": "finished", "outcome": Outcome(answer="sunny")})
    with pytest.raises(StoreError, match=f"episode '{episode.id}' already ended in the trace store: failed \\(expired"):
        store.finish(late)  # counted as expired in a window already: never trained on as finished
    assert store.get(episode.id).failure_reason == EXPIRED and store.get(episode.id).outcome is None
    with pytest.raises(StoreError, match="no episode 'missing'"):
        store.finish(late.model_copy(update={"id": "missing"}))
    store.close()


def test_identical_feedback_posted_at_once_is_one_row(store_url):
    """Each post reads, then writes: two at once both found no row, and on PostgreSQL both inserted (a key error)."""
    store = Store(store_url)
    episode = _episode(store, calls=10)
    errors = []

    def post(index: int, ready: threading.Barrier) -> None:
        ready.wait()
        try:
            store.add_feedback(episode.id, index, "accepted", None)
        except Exception as exc:  # what the gateway would answer 500 for
            errors.append(repr(exc))

    for index in range(10):
        ready = threading.Barrier(3)
        posts = [threading.Thread(target=post, args=(index, ready)) for _ in range(3)]
        for thread in posts:
            thread.start()
        for thread in posts:
            thread.join()
    assert errors == []
    (row,) = store.episodes()
    assert sorted(f.call_index for f in row.feedback) == list(range(10))
    store.close()


def test_an_end_is_stamped_once_the_store_can_write_it(tmp_path):
    """Stamped before the write lock came free, an end could fall behind a window a cycle had already read."""
    store = Store(tmp_path / "t.db")
    episode = _episode(store)
    other = sqlite3.connect(tmp_path / "t.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    freed = []

    def free() -> None:
        time.sleep(1.0)
        freed.append(time.time())
        other.execute("COMMIT")

    writer = threading.Thread(target=free)
    writer.start()
    store.finish(episode.model_copy(update={"status": "finished", "outcome": Outcome(answer="x")}))
    writer.join()
    assert [r.episode.id for r in store.episodes(since=freed[0], model="weather", ended=True)] == [episode.id]
    other.close()
    store.close()


def test_plain_paths_are_sqlite(tmp_path):
    store = Store(tmp_path / "sub" / "t.db")
    assert store.url.startswith("sqlite:///") and (tmp_path / "sub" / "t.db").is_file()
    with store.engine.connect() as db:
        assert db.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    store.close()


def test_a_file_that_is_not_a_database_is_refused_naming_it(tmp_path):
    (tmp_path / "traces.jsonl").write_text('{"messages": []}\n' * 50)
    with pytest.raises(ValueError, match=r"traces.jsonl: cannot open it as a trace store: file is not a database"):
        Store(tmp_path / "traces.jsonl")
    with pytest.raises(ValueError, match="cannot open it as a trace store") as refused:
        Store("nosuchdriver://user:secret@host/db")
    assert "secret" not in str(refused.value)
    done = cli("ingest", tmp_path / "traces.jsonl", "--store", tmp_path / "traces.jsonl")
    assert done.exit_code == 2 and "--store: store" in done.stderr and "not a database" in done.stderr, done.output
