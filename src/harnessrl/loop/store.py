"""The trace store: every production episode, call and feedback signal, committed before it is acknowledged.

SQL through SQLAlchemy Core: SQLite by default (WAL, `synchronous=FULL`, so a commit survives a
SIGKILL and a power cut), PostgreSQL or any SQLAlchemy URL by `--store`. Rows hold JSON text, so the
schema is the same everywhere. A call row is the whole `Call` (token ids, sampled logprobs, policy
version), keyed by (episode, call index); feedback is keyed by the same pair, so posting it twice
changes nothing and a later signal for a call replaces the earlier one.

The gateway writes through the `Recorder` methods (add_episode, add_calls, finish, add_feedback);
the cycle reads `episodes(...)` back as typed `Episode`s with their feedback. It knows nothing
about rewards or training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.dialects import postgresql, sqlite

from harnessrl.gateway.serving import EXPIRED, RecordError
from harnessrl.types import Call, Episode, Outcome, Task, first_error

_meta = sa.MetaData()
episodes_table = sa.Table(
    "episodes",
    _meta,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(200), nullable=False),  # the served model (a registry's name)
    sa.Column("policy_version", sa.Integer, nullable=False),  # the version serving when it was created
    sa.Column("task", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("outcome", sa.Text),
    sa.Column("failure_reason", sa.Text),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("updated_at", sa.Float, nullable=False, index=True),  # an ended episode's: when it ended
)
calls_table = sa.Table(
    "calls",
    _meta,
    sa.Column("episode_id", sa.String(64), sa.ForeignKey("episodes.id"), primary_key=True),
    sa.Column("call_index", sa.Integer, primary_key=True),
    sa.Column("response_id", sa.String(64), index=True),  # the chat completion id the client got back
    sa.Column("policy_version", sa.Integer, nullable=False),
    sa.Column("call", sa.Text, nullable=False),  # the Call's JSON: ids, sampled logprobs, ...
)
feedback_table = sa.Table(
    "feedback",
    _meta,
    sa.Column("episode_id", sa.String(64), sa.ForeignKey("episodes.id"), primary_key=True),
    sa.Column("call_index", sa.Integer, primary_key=True),
    sa.Column("signal", sa.String(16), nullable=False),
    sa.Column("value", sa.Float),
    sa.Column("received_at", sa.Float, nullable=False),
)
traces_table = sa.Table(  # `harnessrl ingest`: imported production conversations
    "traces",
    _meta,
    sa.Column("id", sa.String(64), primary_key=True),  # sha256 of the canonical line: re-imports are duplicates
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("line", sa.Integer, nullable=False),
    sa.Column("trace", sa.Text, nullable=False),
    sa.Column("imported_at", sa.Float, nullable=False),
)


# INSERT ... ON CONFLICT DO UPDATE, spelt alike by both dialects
_UPSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


class StoreError(RecordError):
    """A request the store cannot honour (unknown episode, call out of range); the message says which."""


@dataclass
class Feedback:
    call_index: int
    signal: str  # accepted | rejected | edited | dissatisfied | scalar
    value: float | None
    received_at: float


@dataclass
class StoredEpisode:
    episode: Episode
    model: str
    policy_version: int  # the version serving when the episode began
    created_at: float
    feedback: list[Feedback]


def store_url(target: str | Path) -> str:
    """A SQLAlchemy URL from a URL or a file path (a path means SQLite)."""
    text = str(target)
    return text if "://" in text else f"sqlite:///{Path(text).resolve()}"


def _shown(url: str) -> str:
    """The URL as an error may print it: without its password."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:  # not a URL SQLAlchemy reads: its scheme is all we show
        return url.split("://")[0] + "://..."


class Store:
    def __init__(self, target: str | Path):
        self.url = store_url(target)
        if self.url.startswith("sqlite:///"):
            Path(self.url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        if self.url.startswith("postgresql://"):  # psycopg 3 is the driver we ship (`pip install psycopg[binary]`)
            self.url = "postgresql+psycopg://" + self.url.removeprefix("postgresql://")
        try:
            self.engine = sa.create_engine(self.url, pool_pre_ping=True)
            if self.engine.dialect.name == "sqlite":
                sa.event.listen(self.engine, "connect", _sqlite_pragmas)
            _meta.create_all(self.engine)
            for index in episodes_table.indexes:  # a store made before an index was declared gets it too
                try:
                    index.create(self.engine, checkfirst=True)
                except sa.exc.DatabaseError:  # another process (the gateway, a cycle) made it first
                    pass
        except sa.exc.SQLAlchemyError as exc:  # not a database, an unknown scheme, a server that refuses
            reason = str(exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc).splitlines()[0]
            raise ValueError(f"store {_shown(self.url)}: cannot open it as a trace store: {reason}") from None

    def close(self) -> None:
        self.engine.dispose()

    # ---- what the gateway writes (each method one transaction, committed when it returns) ----

    def add_episode(self, episode: Episode, model: str, policy_version: int) -> None:
        now = time.time()
        with self.engine.begin() as db:
            db.execute(sa.insert(episodes_table).values(
                id=episode.id, model=model, policy_version=policy_version, task=episode.task.model_dump_json(),
                status=episode.status, created_at=now, updated_at=now,
            ))  # fmt: skip

    def add_calls(self, episode_id: str, calls: list[tuple[int, Call, str | None]]) -> None:
        """(index, call, response id) rows; a call recorded again (a held choice of n the agent went on
        from, now trainable) gets its new JSON and keeps its response id."""
        with self.engine.begin() as db:
            mine = calls_table.c.episode_id == episode_id
            have = {r.call_index for r in db.execute(sa.select(calls_table.c.call_index).where(
                mine, calls_table.c.call_index.in_([index for index, _, _ in calls])
            ))}  # fmt: skip
            for index, call, _ in calls:
                if index in have:
                    row = mine & (calls_table.c.call_index == index)
                    db.execute(sa.update(calls_table).where(row).values(call=call.model_dump_json()))
            new = [
                {"episode_id": episode_id, "call_index": index, "response_id": response_id,
                 "policy_version": call.policy_version, "call": call.model_dump_json()}
                for index, call, response_id in calls if index not in have
            ]  # fmt: skip
            if new:
                db.execute(sa.insert(calls_table), new)
            running = (episodes_table.c.id == episode_id) & (episodes_table.c.status == "running")
            db.execute(sa.update(episodes_table).where(running).values(updated_at=time.time()))  # an end stays put

    def finish(self, episode: Episode) -> None:
        """End a running episode. One the store already ended (a cycle expired it, perhaps counted it in a window
        already) stays as it is: a StoreError naming it and how it ended."""
        with self.engine.begin() as db:
            this = episodes_table.c.id == episode.id
            done = db.execute(sa.update(episodes_table).where(this & (episodes_table.c.status == "running")).values(
                status=episode.status, failure_reason=self._text(episode.failure_reason),
                outcome=episode.outcome.model_dump_json() if episode.outcome else None,
            ))  # fmt: skip
            if done.rowcount:  # its end stamped now, holding the write lock (SQLite's wait is up to 30 s): stamped
                # before the wait, an end could fall behind a window a cycle had read before the commit
                db.execute(sa.update(episodes_table).where(this).values(updated_at=time.time()))
            else:  # ended already (or never stored): the end the store has stands
                row = db.execute(sa.select(episodes_table).where(this)).first()
                if row is None:
                    raise StoreError(f"no episode {episode.id!r} in the store", "id")
                reason = f" ({row.failure_reason})" if row.failure_reason else ""
                raise StoreError(f"episode {episode.id!r} already ended in the trace store: {row.status}{reason}", "id")

    def add_feedback(self, episode_id: str, call: int | str | None, signal: str, value: float | None) -> int:
        """Record a signal for (episode, call) — `call` an index, a chat completion id, or None for the
        episode's last call; returns the call index. Idempotent: the same signal again changes nothing."""
        with self.engine.begin() as db:
            if (
                self._unstorable(episode_id)
                or db.execute(sa.select(episodes_table.c.id).where(episodes_table.c.id == episode_id)).first() is None
            ):
                raise StoreError(f"no episode {episode_id!r} in the store", "id")
            index = self._call_index(db, episode_id, call)
            row = {"episode_id": episode_id, "call_index": index, "signal": signal, "value": value,
                   "received_at": time.time()}  # fmt: skip
            upsert = _UPSERTS.get(db.dialect.name)
            if upsert is not None:  # one statement: two identical posts at once cannot both insert (a key error)
                new, column = upsert(feedback_table).values(row), feedback_table.c
                # the same signal again: no change (received_at included)
                changed = (column.signal != new.excluded.signal) | column.value.is_distinct_from(new.excluded.value)
                replace = {name: new.excluded[name] for name in ("signal", "value", "received_at")}
                primary = [column.episode_id, column.call_index]
                db.execute(new.on_conflict_do_update(index_elements=primary, set_=replace, where=changed))
                return index
            key = (feedback_table.c.episode_id == episode_id) & (feedback_table.c.call_index == index)
            old = db.execute(sa.select(feedback_table.c.signal, feedback_table.c.value).where(key)).first()
            if old is None or (old.signal, old.value) != (signal, value):  # another database: in two statements
                db.execute(sa.delete(feedback_table).where(key))
                db.execute(sa.insert(feedback_table).values(row))
        return index

    def _text(self, text: str | None) -> str | None:
        """A free text column's value (an exception's message may hold NUL, which PostgreSQL's text cannot): NUL
        written as the four characters \\x00 there."""
        return text.replace("\x00", "\\x00") if text and self.engine.dialect.name == "postgresql" else text

    def _unstorable(self, episode_id: str) -> bool:
        """An id no row can have: PostgreSQL's text holds no NUL (a query with one is an error, not "no row")."""
        return "\x00" in episode_id and self.engine.dialect.name == "postgresql"

    @staticmethod
    def _call_index(db, episode_id: str, call: int | str | None) -> int:
        rows = db.execute(
            sa.select(calls_table.c.call_index, calls_table.c.response_id).where(calls_table.c.episode_id == episode_id)
        ).all()
        if not rows:
            raise StoreError(f"episode {episode_id!r} has no calls to give feedback on", "call")
        if call is None:
            return max(r.call_index for r in rows)
        if isinstance(call, str):
            found = [r.call_index for r in rows if r.response_id == call]
            if not found:
                raise StoreError(f"call: no chat completion {call!r} in episode {episode_id!r}", "call")
            return min(found)
        if call not in {r.call_index for r in rows}:
            raise StoreError(f"call: episode {episode_id!r} has calls 0..{len(rows) - 1}, not {call}", "call")
        return call

    def expire(self, ttl_seconds: float, model: str, now: float | None = None) -> list[str]:
        """Running episodes of `model` idle for over `ttl_seconds` become failed with reason EXPIRED, ended when
        their TTL ran out (last activity + TTL: the window they fall in does not depend on when this runs);
        returns their ids. Other models' sessions in a shared store keep their own TTL."""
        cutoff = (now or time.time()) - ttl_seconds
        stale = (episodes_table.c.status == "running") & (episodes_table.c.updated_at < cutoff)
        stale &= episodes_table.c.model == model
        update = (
            sa.update(episodes_table)
            .where(stale)
            .values(status="failed", failure_reason=EXPIRED, updated_at=episodes_table.c.updated_at + ttl_seconds)
        )
        with self.engine.begin() as db:
            if self.engine.dialect.update_returning:  # the rows it changed, not ones touched since a SELECT
                return [r.id for r in db.execute(update.returning(episodes_table.c.id))]
            ids = [r.id for r in db.execute(sa.select(episodes_table.c.id).where(stale))]
            db.execute(update.where(episodes_table.c.id.in_(ids)))
        return ids

    # ---- what the cycle reads ----

    def episodes(
        self,
        since: float = 0.0,
        until: float | None = None,
        model: str | None = None,
        ended: bool = False,
        unreadable: list[str] | None = None,
    ) -> list[StoredEpisode]:
        """Episodes created in [since, until), oldest first, with their calls and feedback; `ended`: those
        that ended (finished or failed; running ones are left out) in [since, until) instead. A stored episode that
        is no valid Episode (rows written by hand or by an older harnessrl) is a ValueError naming it and its field;
        with an `unreadable` list, it is left out and its message appended there instead."""
        at = episodes_table.c.updated_at if ended else episodes_table.c.created_at
        where = at >= since
        if until is not None:
            where &= at < until
        if ended:
            where &= episodes_table.c.status != "running"
        if model is not None:
            where &= episodes_table.c.model == model
        with self.engine.connect() as db:
            rows = db.execute(sa.select(episodes_table).where(where).order_by(episodes_table.c.created_at)).all()
            ids = [r.id for r in rows]
            calls, feedback = {i: [] for i in ids}, {i: [] for i in ids}
            for chunk in _chunks(ids, 500):
                for c in db.execute(sa.select(calls_table).where(calls_table.c.episode_id.in_(chunk))):
                    calls[c.episode_id].append((c.call_index, c.call))
                for f in db.execute(sa.select(feedback_table).where(feedback_table.c.episode_id.in_(chunk))):
                    feedback[f.episode_id].append(Feedback(f.call_index, f.signal, f.value, f.received_at))
        stored = []
        for r in rows:
            try:
                episode = _episode(r, calls[r.id])
            except ValidationError as exc:
                message = f"store {_shown(self.url)}: episode {r.id}: {first_error(exc, 'episode')}"
                if unreadable is None:
                    raise ValueError(message) from None
                unreadable.append(message)
                continue
            stored.append(StoredEpisode(episode, r.model, r.policy_version, r.created_at, feedback[r.id]))
        return stored

    def running(self, model: str | None = None) -> int:
        """How many episodes are still running."""
        where = episodes_table.c.status == "running"
        if model is not None:
            where &= episodes_table.c.model == model
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(episodes_table).where(where)).scalar_one()

    def get(self, episode_id: str) -> Episode | None:
        if self._unstorable(episode_id):
            return None
        with self.engine.connect() as db:
            row = db.execute(sa.select(episodes_table).where(episodes_table.c.id == episode_id)).first()
            if row is None:
                return None
            calls = db.execute(
                sa.select(calls_table.c.call_index, calls_table.c.call).where(calls_table.c.episode_id == episode_id)
            ).all()
        return _episode(row, calls)

    def response_ids(self) -> set[str]:
        with self.engine.connect() as db:
            return {r.response_id for r in db.execute(sa.select(calls_table.c.response_id)) if r.response_id}

    def add_traces(self, source: str, rows: list[tuple[str, int, str]]) -> int:
        """(id, line number, trace JSON) rows; those already stored are left as they are. Returns how many were new."""
        with self.engine.begin() as db:
            have = set()
            for chunk in _chunks([i for i, _, _ in rows], 500):
                have |= {r.id for r in db.execute(sa.select(traces_table.c.id).where(traces_table.c.id.in_(chunk)))}
            new = [r for r in rows if r[0] not in have]
            if new:
                db.execute(sa.insert(traces_table), [
                    {"id": i, "source": source, "line": n, "trace": t, "imported_at": time.time()} for i, n, t in new
                ])  # fmt: skip
        return len(new)


def _episode(row, calls: list[tuple[int, str]]) -> Episode:
    ordered = [Call.model_validate_json(text) for _, text in sorted(calls)]
    return Episode(
        id=row.id,
        task=Task.model_validate_json(row.task),
        calls=ordered,
        outcome=Outcome.model_validate_json(row.outcome) if row.outcome else None,
        status=row.status,
        failure_reason=row.failure_reason,
    )


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cursor.execute("PRAGMA synchronous=FULL")  # a commit is on disk when it returns
    cursor.execute("PRAGMA busy_timeout=30000")  # concurrent writers wait instead of failing
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _chunks(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start : start + size]
