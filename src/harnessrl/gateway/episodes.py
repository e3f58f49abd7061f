"""Episodes in memory, each with its own random API key; the key is what binds a chat call to it."""

from __future__ import annotations

import secrets
import time
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
    responses: dict[str, int] = field(default_factory=dict)  # chat completion id -> its (first) call index
    lineage_parents: dict[str, int | None] = field(default_factory=dict)  # lineage -> the call that spawned it
    touched: float = field(default_factory=time.monotonic)  # last activity; idle past the session TTL expires it


class EpisodeStore:
    def __init__(self) -> None:
        self._by_id: dict[str, EpisodeRecord] = {}
        self._by_key: dict[str, EpisodeRecord] = {}
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

    def ids(self) -> list[str]:
        return list(self._by_id)
