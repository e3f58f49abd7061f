"""Episodes in memory, each with its own random API key; the key is what binds a chat call to it."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from harnessrl.gateway.prompts import Turn
from harnessrl.types import Episode, Task


@dataclass
class EpisodeRecord:
    episode: Episode
    api_key: str
    agent: str
    trainable: bool
    turns: list[Turn] = field(default_factory=list)  # aligned with episode.calls
    in_flight: int = 0  # chat calls still generating; `finish` waits for them
    finishing: bool = False  # a finish is being stored
    # choices of an n > 1 request, recorded untrainable: call index -> the trainable flag it gets if a later call extends it
    held_choices: dict[int, bool] = field(default_factory=dict)
    responses: dict[str, range] = field(default_factory=dict)  # chat completion id -> its calls (one a choice)
    lineage_parents: dict[str, int | None] = field(default_factory=dict)  # lineage -> the call that spawned it
    lineage_claims: Counter = field(default_factory=Counter)  # lineage -> requests under way that agreed to its parent
    touched: float = field(default_factory=time.monotonic)  # last activity; idle past the session TTL expires it
    # held by a request from appending its calls until they are committed: a commit the trace store refuses then
    # takes back only that request's calls (no other request appended after them meanwhile)
    appending: asyncio.Lock = field(default_factory=asyncio.Lock)

    def claim(self, lineage: str, parent: int | None) -> int | None:
        """The parent `lineage` began with (now `parent`, if this is its first request); this request holds it until
        `release`. No await between the check and the claim, so concurrent first requests agree."""
        began = self.lineage_parents.setdefault(lineage, parent)
        if began == parent:
            self.lineage_claims[lineage] += 1
        return began

    def release(self, lineage: str) -> None:
        """A request that claimed `lineage` ended: where none is left under way and no call of it was recorded (every
        one failed), the lineage is unclaimed, so a retry may name another parent."""
        self.lineage_claims[lineage] -= 1
        if self.lineage_claims[lineage] <= 0:
            del self.lineage_claims[lineage]
            # newest first: an agent's own last call is usually the one found, so a request costs O(1), not O(calls)
            if not any((c.lineage or c.agent) == lineage for c in reversed(self.episode.calls)):
                self.lineage_parents.pop(lineage, None)

    def take_back(self, first: int, reflagged: int | None = None) -> None:
        """Undo one request's appends: its calls from `first` on (their turns, completion ids and held
        choices) and the held choice it made trainable (`reflagged`). What a refused commit leaves."""
        calls = self.episode.calls
        del calls[first:], self.turns[first:]
        for response_id in [r for r, indices in self.responses.items() if indices.start >= first]:
            del self.responses[response_id]
        for index in [i for i in self.held_choices if i >= first]:
            del self.held_choices[index]
        if reflagged is not None:  # held again, untrainable, as before the request
            self.held_choices[reflagged], calls[reflagged].trainable = calls[reflagged].trainable, False


ENDED_KEYS_KEPT = 100_000  # keys of episodes the session TTL moved out of memory, remembered (about 30 MB)


class EpisodeStore:
    def __init__(self) -> None:
        self._by_id: dict[str, EpisodeRecord] = {}
        self._by_key: dict[str, EpisodeRecord] = {}
        # key -> (episode id, how it ended) of the latest episodes that left memory: their agents hear that it
        # ended (409), not "invalid API key" (401, which an agent takes for a wrong configuration)
        self._ended_keys: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self.expired = 0  # sessions that sent no finish within the TTL

    def create(self, task: Task, agent: str = "main", trainable: bool = True) -> EpisodeRecord:
        record = EpisodeRecord(Episode(task=task), "hrl-ep-" + secrets.token_urlsafe(24), agent, trainable)
        self._by_id[record.episode.id] = record
        self._by_key[record.api_key] = record
        return record

    def get(self, episode_id: str) -> EpisodeRecord | None:
        return self._by_id.get(episode_id)

    def by_key(self, api_key: str) -> EpisodeRecord | None:
        return self._by_key.get(api_key)

    def delete(self, episode_id: str) -> EpisodeRecord | None:
        record = self._by_id.pop(episode_id, None)
        if record is not None:
            self._by_key.pop(record.api_key, None)
        return record

    def forget(self, episode_id: str, how: str) -> None:
        """Drop an ended episode from memory (a trace store keeps it), remembering its key and `how` it ended."""
        record = self.delete(episode_id)
        if record is not None:
            self._ended_keys[record.api_key] = (episode_id, how)
            if len(self._ended_keys) > ENDED_KEYS_KEPT:
                self._ended_keys.popitem(last=False)

    def ended_by_key(self, api_key: str) -> tuple[str, str] | None:
        """(episode id, how it ended) for the key of an episode that left memory, while it is remembered."""
        return self._ended_keys.get(api_key)

    def ids(self) -> list[str]:
        return list(self._by_id)
