"""The swarm helper through a real gateway: frozen sub-agents run concurrently under their parent call;
failures, timeouts and step limits come back as observations; limits and budgets hold."""

import asyncio
import json

import openai
import pytest

from harnessrl.calltree import critical_steps
from harnessrl.envs.wide.expert import demonstrate
from harnessrl.harness.swarm import Swarm, SwarmLimits
from harnessrl.harness.tools import Toolbox
from tests.harness.scripted_swarm import call, chatterbox, run_scripted, worker


async def test_assigned_sub_agents_run_concurrently_under_the_call_that_assigned_them(swarm_gateway):
    started, all_started = [], asyncio.Event()

    async def together(assignment, llm):  # waits for the other two: run one after another, none would finish
        started.append(assignment.task)
        if len(started) == 3:
            all_started.set()
        await asyncio.wait_for(all_started.wait(), timeout=20)
        return await worker(assignment, llm)

    episode, swarm, _ = await run_scripted(swarm_gateway, tasks=3, subagent=together)
    orchestrator = [i for i, c in enumerate(episode.calls) if c.agent == "main"]
    subs = [c for c in episode.calls if c.agent == "scout"]
    assert len(orchestrator) == 3 and len(subs) == 3
    assert all(c.parent_call == orchestrator[1] and c.model == "sub" and not c.trainable for c in subs)
    assert len({c.lineage for c in subs}) == 3
    # critical steps: 3 orchestrator replies + the longest sub-agent (1 step), live and from the record
    assert swarm.critical_steps == critical_steps(episode.calls) == 4 and len(episode.calls) == 6
    summary = episode.outcome.info["swarm"]
    assert summary["assigned"] == summary["finished"] == 3 and summary["subagents"] == 1
    assert summary["distinct"] == summary["distinct_finished"] == 3


async def test_repeats_of_one_task_count_once(swarm_gateway):
    async def first_finishes(assignment, llm):  # the last text never finishes
        return await (chatterbox if assignment.task == "item 9" else worker)(assignment, llm)

    # a zero-width space or full-width letters made a repeat distinct: r_parallel paid for padding with them
    texts = ["Item 0", "item  0.", "item 0", "item\u200b 0", "\uff49\uff54\uff45\uff4d 0", "item 1", "item 9"]
    episode, _, _ = await run_scripted(swarm_gateway, texts, first_finishes, SwarmLimits(max_subagent_steps=1))
    summary = episode.outcome.info["swarm"]
    assert (summary["assigned"], summary["finished"]) == (7, 6)
    assert (summary["distinct"], summary["distinct_finished"]) == (3, 2)


async def test_failed_sub_agents_are_observations_and_count_unfinished(swarm_gateway):
    async def crash(assignment, llm):
        raise ValueError("tool exploded")

    async def slow(assignment, llm):
        await asyncio.sleep(30)

    async def silent(assignment, llm):
        await worker(assignment, llm)
        return None

    async def blank(assignment, llm):  # an empty output read as finished: r_finish paid for nothing
        await worker(assignment, llm)
        return " \n"

    async def own_timeout(assignment, llm):  # its own TimeoutError (the builtin, as asyncio's) is not the swarm's
        raise TimeoutError("search backend slow")

    async def cancels_itself(assignment, llm):  # not a cancel of the episode: the sub-agent's own failure
        raise asyncio.CancelledError()

    async def exits(assignment, llm):  # in a task, sys.exit stopped the event loop: every episode of the run with it
        await worker(assignment, llm)
        raise SystemExit(3)

    for subagent, expected in [
        (crash, "did not finish: ValueError: tool exploded"),
        (slow, "did not finish: timed out after 0.3 s"),
        (own_timeout, "did not finish: TimeoutError: search backend slow"),
        (cancels_itself, "did not finish: CancelledError"),
        (exits, "did not finish: the sub-agent called sys.exit(3)"),
        (chatterbox, "did not finish: StepLimitError: step limit: 2 model calls per sub-agent run"),
        (silent, "gave no output in 1 steps"),
        (blank, "gave no output in 1 steps"),
    ]:
        limits = SwarmLimits(subagent_timeout=0.3 if subagent is slow else 60, max_subagent_steps=2)
        episode, swarm, messages = await run_scripted(swarm_gateway, tasks=2, subagent=subagent, limits=limits)
        assert episode.status == "finished" and episode.outcome.info["swarm"]["finished"] == 0
        outputs = json.loads(messages[-2]["content"])  # assign_tasks' observation: the outputs by position
        assert outputs == {str(i + 1): f"error: sub-agent scout (scout/{i}) {expected}" for i in range(2)}
    assert [r.steps for r in swarm.runs] == [1, 1]


async def test_limits_and_budgets(swarm_gateway):
    _, key = await swarm_gateway.create_episode()
    llm = swarm_gateway.openai(key)
    swarm = Swarm(llm, worker, model="sub", limits=SwarmLimits(max_subagents=1, max_assignments=2, max_parallel=2,
                                                               max_orchestrator_steps=5, max_critical_steps=6))  # fmt: skip
    with pytest.raises(RuntimeError, match="through Swarm.execute"):
        await swarm.assign_task("a", "x")
    messages = [{"role": "user", "content": "go"}]

    async def step(*tool_calls) -> list[str]:
        response = await demonstrate(llm, messages, swarm.schemas, list(tool_calls))
        return [m["content"] for m in await swarm.execute(response)]

    assert await step(call("create_subagent", name="a", instructions="i"), call("create_subagent", name="b", instructions="i")) == [
        "created a", "error: at most 1 sub-agents; reuse one of a"]  # fmt: skip
    assert swarm.critical_steps == 1
    assert await swarm.create_subagent("", "i") == (
        "error: name '': 1-64 letters, digits, '_' or '-', and not 'main' (the orchestrator's)"
    )
    assert (await swarm.create_subagent("main", "i")).startswith("error: name 'main'")
    assert (await swarm.create_subagent("a b/c", "i")).startswith("error: name 'a b/c'") and list(swarm.agents) == ["a"]
    too_many = [{"agent": "a", "task": str(i)} for i in range(3)]
    assert await step(call("assign_tasks", assignments=too_many)) == ["error: at most 2 assignments at once"]
    assert (await step(call("assign_task", agent="b", task="x")))[0].startswith("error: no sub-agent 'b'")
    assert swarm.exhausted is None and swarm.critical_steps == 3
    outputs = await step(
        call("assign_task", agent="a", task="x"),
        call("assign_task", agent="a", task="y"),
        call("assign_task", agent="a", task="z"),
    )
    assert [o.startswith("error") for o in outputs] == [False, False, True] and "at most 2 assignments" in outputs[2]
    # the budget left one step for this reply's runs (6 - 3 - 2): the stage cost 2, and one reply is left to answer
    assert swarm.critical_steps == 5 and swarm.exhausted is None
    bad = await step(
        call("assign_tasks", assignments=[{"agent": "a"}]), call("nope"), call("assign_task", agent="a", task="w")
    )
    assert bad == ["error: assignments.0: needs exactly the keys agent and task",
                   "error: unknown tool 'nope'; available: create_subagent, assign_task, assign_tasks",
                   "error: the critical-step budget (6) leaves sub-agents no step"]  # fmt: skip
    assert len(swarm.runs) == 2
    assert swarm.exhausted == "orchestrator step limit (5)"


async def test_max_parallel_holds_across_the_tool_calls_of_a_reply(swarm_gateway):
    """Three assign_task calls and an assign_tasks of two in one reply: five runs, two at a time; the rest wait."""
    active, peak = 0, 0

    async def counted(assignment, llm):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        try:
            await asyncio.sleep(0.2)  # long enough that every run not held back has started
            return await worker(assignment, llm)
        finally:
            active -= 1

    _, key = await swarm_gateway.create_episode()
    llm = swarm_gateway.openai(key)
    swarm = Swarm(llm, counted, model="sub", limits=SwarmLimits(max_parallel=2))
    messages = [{"role": "user", "content": "go"}]
    both = [{"agent": "a", "task": "y"}, {"agent": "a", "task": "z"}]
    reply = [call("create_subagent", name="a", instructions="i"), *(call("assign_task", agent="a", task=t) for t in "uvw"),
             call("assign_tasks", assignments=both)]  # fmt: skip
    outputs = await swarm.execute(await demonstrate(llm, messages, swarm.schemas, reply))
    assert peak == 2 and not any(m["content"].startswith("error") for m in outputs)
    assert [r.finished for r in swarm.runs] == [True] * 5 and [r.steps for r in swarm.runs] == [1] * 5
    assert swarm.critical_steps == 1 + 3  # five one-step runs on two slots: three rounds (it counted 1 + 1)


async def test_a_call_that_did_not_return_is_not_a_step(swarm_gateway):
    """A call the gateway refused (400) is not in the call tree: counted, it put the live critical steps past the
    record's and spent the budget on nothing."""

    async def one_refused(assignment, llm):
        answer = await worker(assignment, llm)
        with pytest.raises(openai.BadRequestError):
            await llm.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=-1)
        return answer

    episode, swarm, _ = await run_scripted(swarm_gateway, tasks=2, subagent=one_refused)
    assert [r.steps for r in swarm.runs] == [1, 1] and all(r.finished for r in swarm.runs)
    assert swarm.critical_steps == critical_steps(episode.calls) == 3 + 1


async def test_a_sub_agent_asking_n_choices_spends_n_steps_as_the_record_counts_them(swarm_gateway):
    async def sampler(assignment, llm):  # best of 3 in one request: the gateway records three calls
        messages = [{"role": "user", "content": assignment.task}]
        response = await llm.chat.completions.create(model="m", messages=messages, max_tokens=4, n=3)
        return response.choices[0].message.content or "-"

    episode, swarm, _ = await run_scripted(swarm_gateway, tasks=1, subagent=sampler)
    assert swarm.runs[0].steps == 3 and len([c for c in episode.calls if c.agent == "scout"]) == 3
    assert swarm.critical_steps == critical_steps(episode.calls) == 1 + (1 + 3) + 1
    limited = SwarmLimits(max_subagent_steps=2)  # 3 choices are more steps than a run may take: refused, unsent
    episode, swarm, _ = await run_scripted(swarm_gateway, tasks=1, subagent=sampler, limits=limited)
    assert swarm.runs[0].steps == 0 and "step limit: 2" in swarm.runs[0].error
    assert swarm.critical_steps == critical_steps(episode.calls)


async def test_the_critical_budget_cuts_the_runs_of_the_reply_that_would_pass_it(swarm_gateway):
    limits = SwarmLimits(max_subagent_steps=10, max_critical_steps=5)
    episode, swarm, messages = await run_scripted(swarm_gateway, tasks=1, subagent=chatterbox, limits=limits)
    # reply 1 created the sub-agent (1 step); reply 2 costs 1 and the answer 1, so its run may take 2, not 10
    assert [r.steps for r in swarm.runs] == [2] and "step limit: 2 model calls" in swarm.runs[0].error
    assert sum(c.agent == "scout" for c in episode.calls) == 2 and swarm.critical_steps == 5  # the answer included


async def test_a_sub_agent_model_the_gateway_does_not_serve_frozen_is_said(swarm_gateway, caplog):
    episode, _, _ = await run_scripted(swarm_gateway, tasks=1, model="sbu")  # "sub" misspelt
    assert any(c.agent == "scout" and c.trainable for c in episode.calls)  # the trainable policy answered
    assert "sub-agent model 'sbu' is not one the gateway serves frozen" in caplog.text


async def test_a_misspelt_tool_is_told_the_tools_of_both_toolboxes(swarm_gateway):
    """With the harness's own tools beside the swarm's, an unknown name was answered by them alone ("available:
    answer"): the orchestrator was told it could not delegate at all."""
    _, key = await swarm_gateway.create_episode()
    llm = swarm_gateway.openai(key)
    swarm = Swarm(llm, worker, model="sub")

    def answer(text: str) -> str:
        """The final answer."""
        return "recorded"

    mine = Toolbox([answer])
    reply = [call("asign_task", agent="a", task="x"), call("answer", text="y")]
    response = await demonstrate(llm, [{"role": "user", "content": "go"}], swarm.schemas + mine.schemas, reply)
    assert [m["content"] for m in await swarm.execute(response, mine)] == [
        "error: unknown tool 'asign_task'; available: create_subagent, assign_task, assign_tasks, answer",
        "recorded",
    ]


async def test_a_lone_surrogate_in_a_task_is_the_models_error_not_the_runs_end(swarm_gateway):
    """JSON's "\\ud800" decodes to a string UTF-8 cannot carry: kept as a run's task, the outcome's summary failed the
    gateway's finish (UnicodeEncodeError), which ends an RL run."""
    episode, swarm, messages = await run_scripted(swarm_gateway, ["item \ud800 0", "item 1"])
    assert episode.status == "finished" and episode.outcome.info["swarm"]["assigned"] == 0 and not swarm.runs
    assert messages[-2]["content"] == (
        "error: assignments.0.task holds '\\ud800' at character 5, a lone surrogate no UTF-8 text can carry"
    )
