"""Critical steps by hand: serial, parallel, nested; and critical <= total for any valid tree."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harnessrl.calltree import CallTreeError, critical_steps, depth, lineages, stage_steps
from harnessrl.types import Call


def call(lineage: str = "main", parent: int | None = None) -> Call:
    agent = lineage.split("/")[0]
    return Call(
        agent=agent,
        lineage=lineage,
        parent_call=parent,
        prompt_ids=[1],
        completion_ids=[],
        sampled_logprobs=[],
        policy_version=0,
    )


def test_serial_is_total():
    # one agent, five calls; and an orchestrator whose sub-agents run one after another
    assert critical_steps([call() for _ in range(5)]) == 5
    serial = [call(), call("a/1", 0), call("a/1", 0), call(), call("b/1", 3), call()]
    assert critical_steps(serial) == len(serial) == 6


def test_parallel_sub_agents_count_once():
    # orchestrator call 0 spawns 4 sub-agents of 3 steps each, then answers: 1 + 3 + 1 = 5 of 14 calls
    calls = [call()]
    for _ in range(3):
        calls += [call(f"s{k}/1", 0) for k in range(4)]
    calls.append(call())
    assert len(calls) == 14
    assert critical_steps(calls) == 5


def test_sub_agents_past_the_parallel_limit_wait_for_a_slot():
    """Runs past `max_parallel` wait for a slot: the stage counted as if all ran at once undercounted the path."""
    calls = [call()]  # orchestrator call 0 spawns 4 sub-agents of 3 steps each, then answers
    for _ in range(3):
        calls += [call(f"s{k}/1", 0) for k in range(4)]
    calls.append(call())
    assert critical_steps(calls, parallel=2) == 1 + 6 + 1  # two at a time: two rounds of 3
    assert critical_steps(calls, parallel=4) == critical_steps(calls) == 1 + 3 + 1
    assert stage_steps([3, 1, 1, 1], 2) == 3  # the short ones share the other slot
    assert stage_steps([1, 1, 1, 3], 2) == 4  # the long one starts last, after a short one
    assert stage_steps([], 2) == 0


def test_unequal_parallel_takes_the_longest():
    calls = [call(), call("a/1", 0), call("b/1", 0), call("b/1", 0), call("b/1", 0), call()]
    assert critical_steps(calls) == 1 + 3 + 1


def test_nested_spawns():
    # main 0 spawns a (calls 1, 4) and b (call 2); a's call 1 spawns c (call 3) and d (calls 5, 6)
    # a = (1 + max(c=1, d=2)) + 1 = 4; main = 1 + max(a=4, b=1) + 1 (call 7) = 6
    calls = [call(), call("a/1", 0), call("b/1", 0), call("c/1", 1), call("a/1", 0), call("d/1", 1), call("d/1", 1)]
    calls.append(call())
    assert critical_steps(calls) == 6
    tree = lineages(calls)
    assert [depth(tree, t) for t in tree] == [0, 1, 1, 2, 2]


def test_parents_must_form_a_tree():
    with pytest.raises(CallTreeError, match="call 1: parent_call 2 must come before lineage 'a/1' begins"):
        critical_steps([call(), call("a/1", 2), call()])
    with pytest.raises(CallTreeError, match="call 1: parent_call 0, but lineage 'main' began with None"):
        critical_steps([call(), call("main", 0)])


@st.composite
def trees(draw):
    calls = [call()]
    names = ["main"]
    for _ in range(draw(st.integers(0, 30))):
        if draw(st.booleans()):  # a new lineage spawned by any earlier call
            parent = draw(st.integers(0, len(calls) - 1))
            names.append(f"x/{len(names)}")
            calls.append(call(names[-1], parent))
        else:  # another step of an existing lineage
            name = draw(st.sampled_from(names))
            first = next(c for c in calls if c.lineage == name)
            calls.append(call(name, first.parent_call))
    return calls


@given(trees())
def test_critical_never_exceeds_total(calls):
    assert 1 <= critical_steps(calls) <= len(calls)
