"""What the gateway serves and where it records: a swappable policy and an optional durable recorder.

`Serving` holds the policy new requests get. `swap(new)` is atomic for the event loop: a request
takes the policy once, when it starts (`use()`), and finishes on it, so its calls record the
version that served them; the old policy is closed when its last request ends.

`Recorder` is what a durable trace store implements (`harnessrl.loop.store.Store`): the gateway calls
it in a worker thread and answers only after it returns, so an acknowledged call is a stored call.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from harnessrl.types import Call, Episode

if TYPE_CHECKING:
    from harnessrl.policy import Policy

EXPIRED = "expired: the session sent no finish within its TTL"  # an expired episode's failure_reason
DELETED = "deleted while running"  # the failure_reason a trace store keeps for an episode deleted unfinished


class RecordError(ValueError):
    """What a recorder refuses (an unknown episode or call); `param` names the request field at fault."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class Recorder(Protocol):
    def add_episode(self, episode: Episode, model: str, policy_version: int) -> None: ...
    def add_calls(self, episode_id: str, calls: list[tuple[int, Call, str | None]]) -> None: ...
    def finish(self, episode: Episode) -> None: ...  # a RecordError where the store ended the episode already
    def add_feedback(self, episode_id: str, call: int | str | None, signal: str, value: float | None) -> int: ...
    def get(self, episode_id: str) -> Episode | None: ...


class Serving:
    def __init__(self, policy: Policy):
        self.policy = policy
        self._users: Counter[int] = Counter()  # id(policy) -> requests running on it
        self._retired: dict[int, Policy] = {}  # swapped out, closed when their last request ends

    @contextlib.contextmanager
    def use(self) -> Iterator[Policy]:
        policy = self.policy
        self._users[id(policy)] += 1
        try:
            yield policy
        finally:
            self._users[id(policy)] -= 1
            if id(policy) in self._retired and self._users[id(policy)] == 0:
                self._retired.pop(id(policy)).close()

    def swap(self, new: Policy) -> Policy:
        """Serve `new` from the next request on; returns the policy it replaced."""
        if new.name != self.policy.name:
            raise ValueError(f"a swap keeps the served name: {new.name!r} is not {self.policy.name!r}")
        old, self.policy = self.policy, new
        if self._users[id(old)] == 0:
            old.close()
        else:
            self._retired[id(old)] = old
        return old

    def in_flight(self) -> int:
        return sum(self._users.values())
