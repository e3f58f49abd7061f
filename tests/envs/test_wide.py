"""Wide research: tasks bundled from any task set, item-F1 by hand, and the scripted orchestrator,
the untrained one and the serial baseline run end to end over real frozen search sub-agents."""

from collections import Counter

import pytest

from harnessrl.calltree import critical_steps
from harnessrl.envs.search import SearchAgent, SearchIndex, synthetic
from harnessrl.envs.wide import OrchestratorExpert, SerialSearch, WideOrchestrator, item_f1, wide_reward, wide_tasks
from harnessrl.envs.wide.harness import search_subagent
from harnessrl.envs.wide.reward import malformed_orchestrator_calls
from harnessrl.envs.wide.tasks import set_aside, shape
from harnessrl.harness.swarm import SwarmLimits
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.types import Call, Episode, Outcome, Task
from tests.harness.scripted_swarm import run_scripted


def test_every_question_lands_in_one_wide_task_of_its_split():
    _, items = synthetic(0, people=40)
    tasks = wide_tasks(items, width=4, seed=1)
    ids = Counter(i for t in tasks for i in t.data["item_ids"])
    by_split = {t.id: t.split for t in items}
    assert set(ids.values()) == {1} and len(ids) >= len(items) - 2  # a lone last question is left out
    assert all(by_split[i] == t.split for t in tasks for i in t.data["item_ids"])
    assert all(2 <= len(t.data["questions"]) <= 4 for t in tasks)
    first = tasks[0]
    assert first.prompt.splitlines()[1] == f"1. {first.data['questions'][0]}"
    assert shape("What was the occupation of Kalo Mirven?") == "What was the occupation of"
    # same-shape questions are bundled together where there are enough
    assert sum(len({shape(q) for q in t.data["questions"]}) == 1 for t in tasks) >= len(tasks) // 2


def test_bundlings_draw_the_train_questions_anew_and_the_test_questions_once():
    _, items = synthetic(0, people=40)
    tasks = wide_tasks(items, width=4, seed=1, bundlings=3)
    split = {t.id: t.split for t in items}
    seen = {s: Counter(i for t in tasks if t.split == s for i in t.data["item_ids"]) for s in ("train", "test")}
    assert set(seen["train"].values()) == {3} and set(seen["test"].values()) == {1}
    assert all(split[i] == t.split for t in tasks for i in t.data["item_ids"])
    assert len({t.id for t in tasks}) == len(tasks)
    train = [tuple(t.data["item_ids"]) for t in tasks if t.split == "train"]
    assert len(set(train)) > len(train) // 3  # drawn anew: not the same bundles three times
    once = wide_tasks(items, width=4, seed=1)  # the test tasks do not depend on the bundlings
    assert [t for t in tasks if t.split == "test"] == [t for t in once if t.split == "test"]


def test_a_validation_split_holds_questions_no_training_task_holds():
    _, items = synthetic(0, people=40)
    rest, held = set_aside(items, 8, seed=1)
    assert len(held) == 8 and all(t.split == "train" for t in held) and len(rest) == len(items) - 8
    validation = wide_tasks(held, width=4, seed=1, name="validation")
    tasks = wide_tasks(rest, width=4, seed=1, bundlings=3)
    assert [t.id for t in validation] == ["wide-validation-0", "wide-validation-1"]
    with pytest.raises(ValueError, match="both splits would share task ids"):  # wide-x-0 for train and test alike
        wide_tasks(items, width=4, name="x")
    training = {i for t in tasks if t.split == "train" for i in t.data["item_ids"]}
    assert training and not training & {i for t in validation for i in t.data["item_ids"]}
    # the test tasks are the ones a run without a validation split gets
    assert [t for t in tasks if t.split == "test"] == [t for t in wide_tasks(items, 4, seed=1) if t.split == "test"]


def test_item_f1_by_hand():
    task = Task(data={"answers": ["baker", "1802", "Kalo"]})

    def f1(answers):
        return item_f1(Episode(task=task, outcome=Outcome(info={"answers": answers})))

    assert f1(["Baker.", "1802", "kalo"]) == 1.0
    assert f1(["baker", "", "x"]) == pytest.approx(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3))  # P 1/2, R 1/3
    assert f1(["baker"]) == pytest.approx(2 * 1 * (1 / 3) / (1 + 1 / 3))
    assert f1([]) == f1(["x", "y", "z"]) == f1({}) == 0.0
    # keyed by question number, as WideSearch matches rows: a skipped item costs that item only
    assert f1({"1": "baker", "3": "Kalo"}) == f1(["baker", "", "Kalo"]) == pytest.approx(0.8)  # P 1, R 2/3
    assert f1({"3": "Kalo", "2": "1802", "1": "baker"}) == 1.0
    assert f1({"1": "baker", "2": "1802", "3": "Kalo", "4": "extra", "x": "y"}) == pytest.approx(2 * 0.6 / 1.6)  # P 3/5
    assert item_f1(Episode(task=task)) == 0.0  # a failed episode has no outcome


def test_only_the_orchestrators_own_broken_calls_are_penalised():
    def call(trainable: bool, error: str | None) -> Call:
        return Call(prompt_ids=[1], completion_ids=[2], sampled_logprobs=[0.0], policy_version=0,
                    trainable=trainable, tool_call_error=error)  # fmt: skip

    episode = Episode(calls=[call(True, "bad JSON"), call(True, None), call(False, "bad JSON")])
    assert malformed_orchestrator_calls(episode) == 0.5
    assert wide_reward().score(episode).terms["malformed_tool_calls"] == -0.25


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    docs, items = synthetic(0, people=24)
    searcher = SearchAgent(SearchIndex(docs, tmp_path_factory.mktemp("chroma")), max_turns=3, max_tokens=24)
    return searcher, wide_tasks(items, width=4)[0]


@pytest.mark.parametrize("assign", ["batch", "each"])
async def test_the_expert_hands_out_every_question_in_one_reply_and_answers_what_came_back(swarm_gateway, wide, assign):
    searcher, task = wide
    orchestrator = WideOrchestrator("sub", searcher, max_tokens=48, assign=assign)
    demo = await RolloutEngine(swarm_gateway, OrchestratorExpert(orchestrator), wide_reward()).episode(task)
    assert demo.status == "finished", demo.failure_reason
    main = [i for i, c in enumerate(demo.calls) if c.agent == "main"]
    subs = [c for c in demo.calls if c.agent == "searcher"]
    assert len(main) == 2 and all(demo.calls[i].demonstration and demo.calls[i].trainable for i in main)
    assert {c.parent_call for c in subs} == {main[0]} and len({c.lineage for c in subs}) == 4
    assert all(c.model == "sub" and not c.trainable for c in subs)
    steps = Counter(c.lineage for c in subs)
    assert critical_steps(demo.calls) == 2 + max(steps.values()) < len(demo.calls)
    summary = demo.outcome.info["swarm"]
    assert summary["critical_steps"] == critical_steps(demo.calls)
    # every question word for word, in order, and the answer is what each sub-agent gave (none: ""), by number
    assert [r["task"] for r in summary["runs"]] == task.data["questions"]
    assert demo.outcome.info["answers"] == {str(i + 1): r["output"] or "" for i, r in enumerate(summary["runs"])}


async def test_the_expert_says_why_its_assignments_were_refused(swarm_gateway, wide):
    """More questions than limits.max_parallel: assign_tasks refuses them whole, and the expert read its error text as
    JSON ("harness raised JSONDecodeError: Expecting value: line 1 column 1 (char 0)")."""
    searcher, task = wide
    orchestrator = WideOrchestrator("sub", searcher, SwarmLimits(max_parallel=2, max_subagent_steps=3))
    demo = await RolloutEngine(swarm_gateway, OrchestratorExpert(orchestrator), wide_reward()).episode(task)
    assert demo.status == "failed" and demo.failure_reason == (
        "harness raised ValueError: the scripted assign_tasks of 4 questions: error: at most 2 assignments at once"
    )


async def test_untrained_orchestrator_and_serial_baseline_end_to_end(swarm_gateway, wide):
    searcher, task = wide
    reward = wide_reward()
    orchestrator = WideOrchestrator("sub", searcher, max_tokens=48)
    # the untrained trainable orchestrator runs (whatever it writes) and is scored
    group = await RolloutEngine(swarm_gateway, orchestrator, reward, RolloutConfig(group_size=2)).group(task)
    assert all(
        e.status == "finished" and set(e.reward.terms) == {"item_f1", "parallel", "finish", "malformed_tool_calls"}
        for e in group
    )
    # the baseline: one search agent, question after question, every step on the critical path
    serial = await RolloutEngine(swarm_gateway, SerialSearch(searcher, model="sub"), reward).episode(task)
    assert serial.status == "finished" and len(serial.outcome.info["answers"]) == 4
    assert critical_steps(serial.calls) == len(serial.calls) >= 4


async def test_a_search_sub_agent_stops_at_its_runs_step_limit(swarm_gateway, wide):
    """The swarm's Assignment.max_steps (here 1, of the searcher's 3 turns) is the search loop's turn limit: a run
    that has not answered ends with no output, not with a StepLimitError from a second call it was never to make."""
    searcher, task = wide
    limits = SwarmLimits(max_subagent_steps=1)
    _, swarm, _ = await run_scripted(swarm_gateway, task.data["questions"][:2], search_subagent(searcher), limits)
    assert [(r.steps, r.error) for r in swarm.runs] == [(1, None), (1, None)]
