"""The call tree of an episode: which conversation each call belongs to, who spawned it, and critical steps.

A lineage is one conversation of one agent (`Call.lineage`, or its agent's name when unset); a
lineage whose first call names a `parent_call` was spawned by that call's tool call (an
orchestrator's `assign_task`). Critical steps follow Kimi K2.5's PARL: each stage costs the
orchestrator's step plus the longest of the sub-agents that step spawned, so only parallel work
shortens the episode:

    critical(L) = sum over calls c of L of (1 + max over lineages K spawned by c of critical(K))

With at most `parallel` sub-agents running at once (the swarm's `max_parallel`; the rest wait for a slot), a
step's spawned lineages take the first free slot in the order they started, and the stage costs 1 + the
longest slot's sum (`stage_steps`): six runs of 3 steps on 2 slots cost 9 steps, not 3.

and an episode's critical steps are the sum over its root lineages (run one after another). A pure
function of the recorded calls: no declared stages, nothing about models or HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harnessrl.types import Call


class CallTreeError(ValueError):
    """The recorded parents do not form a tree (a parent after its child, or a lineage with two parents)."""


@dataclass
class Lineage:
    name: str
    agent: str
    calls: list[int]  # indices into the episode's calls, in order
    parent_call: int | None  # the call that spawned it; None for a root


def lineage_of(call: Call) -> str:
    return call.lineage or call.agent


def lineages(calls: Sequence[Call]) -> list[Lineage]:
    """Every lineage, in order of its first call; CallTreeError when its calls name different parents or a
    parent that does not come before the lineage begins."""
    found: dict[str, Lineage] = {}
    for index, call in enumerate(calls):
        name = lineage_of(call)
        if name not in found:
            if call.parent_call is not None and call.parent_call >= index:
                raise CallTreeError(
                    f"call {index}: parent_call {call.parent_call} must come before lineage {name!r} begins"
                )
            found[name] = Lineage(name, call.agent, [], call.parent_call)
        lineage = found[name]
        if call.parent_call != lineage.parent_call:
            raise CallTreeError(
                f"call {index}: parent_call {call.parent_call}, but lineage {name!r} began with {lineage.parent_call}"
            )
        lineage.calls.append(index)
    return list(found.values())


def children(tree: list[Lineage]) -> dict[int, list[Lineage]]:
    """The lineages each call spawned."""
    out: dict[int, list[Lineage]] = {}
    for lineage in tree:
        if lineage.parent_call is not None:
            out.setdefault(lineage.parent_call, []).append(lineage)
    return out


def critical_steps(calls: Sequence[Call], parallel: int | None = None) -> int:
    """Steps on the critical path (see the module docstring), `parallel` sub-agents at once at most (None: all of a
    step's); equals len(calls) when nothing runs in parallel."""
    tree = lineages(calls)
    spawned = children(tree)
    cost: dict[str, int] = {}
    # a child's first call comes after its parent call, so children are done before their parents
    for lineage in sorted(tree, key=lambda t: t.calls[0], reverse=True):
        cost[lineage.name] = sum(
            1 + stage_steps([cost[k.name] for k in sorted(spawned.get(c, []), key=lambda k: k.calls[0])], parallel)
            for c in lineage.calls
        )
    return sum(cost[t.name] for t in tree if t.parent_call is None)


def stage_steps(runs: Sequence[int], parallel: int | None = None) -> int:
    """Steps until every run of a stage is done: `runs` (each run's steps, in the order they started) on `parallel`
    slots (None: one each), each run taking the first slot to come free."""
    slots = [0] * min(len(runs), parallel or len(runs))
    for steps in runs:
        slots[slots.index(min(slots))] += steps
    return max(slots, default=0)


def depth(tree: list[Lineage], lineage: Lineage) -> int:
    """0 for a root, 1 for what a root spawned, and so on (for indenting a listing)."""
    owner = {c: t for t in tree for c in t.calls}
    level = 0
    while lineage.parent_call is not None:
        lineage, level = owner[lineage.parent_call], level + 1
    return level
