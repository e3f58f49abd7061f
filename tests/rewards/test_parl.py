"""PARL reward by hand, swarm metrics, and the two alarms tripped by scripted orchestrators that
collapse to serial work or farm sub-agents that never finish."""

import pytest

from harnessrl.harness.swarm import SwarmLimits
from harnessrl.rewards import Term, anneal_to_zero
from harnessrl.rewards.parl import SwarmAlarms, parl_reward, swarm_metrics
from harnessrl.types import Episode, Outcome
from tests.harness.scripted_swarm import chatterbox, run_scripted, worker


def _episode(assigned: int, finished: int, success: bool) -> Episode:
    return Episode(outcome=Outcome(success=success, info={"swarm": {"assigned": assigned, "finished": finished}}))


def test_parl_reward_by_hand_and_its_lambdas_anneal():
    reward = parl_reward(
        Term("perf", lambda e: float(e.outcome.success)), anneal_to_zero(0.2, 10), anneal_to_zero(0.1, 10), cap=4
    )
    episode = _episode(assigned=2, finished=1, success=True)
    early = reward.score(episode, step=0)
    assert early.terms == pytest.approx({"perf": 1.0, "parallel": 0.2 * 2 / 4, "finish": 0.1 * 1 / 2})
    assert early.total == pytest.approx(1.15)
    assert reward.score(episode, step=5).total == pytest.approx(1 + 0.1 * 0.5 + 0.05 * 0.5)
    assert reward.score(episode, step=10).total == 1.0  # annealed away: only the outcome pays
    # farming many sub-agents pays no more than the cap; none assigned earns no finish credit
    assert reward.score(_episode(40, 40, False), 0).total == pytest.approx(0.2 + 0.1)
    assert reward.score(_episode(0, 0, False), 0).total == 0.0
    # padding with repeats of one task: four runs of the same text are one distinct assignment
    padded = Episode(
        outcome=Outcome(
            success=False, info={"swarm": {"assigned": 4, "finished": 4, "distinct": 1, "distinct_finished": 1}}
        )
    )
    assert reward.score(padded, 0).terms == pytest.approx({"perf": 0.0, "parallel": 0.2 / 4, "finish": 0.1 / 4})
    metrics = swarm_metrics([_episode(2, 1, True), _episode(0, 0, False), padded], reward, step=5)
    assert metrics["swarm/repeated"] == pytest.approx(1.0)
    metrics = swarm_metrics([_episode(2, 1, True), _episode(0, 0, False)], reward, step=5)
    assert metrics["swarm/spawn_rate"] == 0.5 and metrics["swarm/finish_rate"] == 0.5
    assert metrics["swarm/unfinished"] == 0.5 and metrics["swarm/lambda_parallel"] == pytest.approx(0.1)


async def _updates(gateway, tasks_by_update: list[int], subagent) -> list[dict[str, float]]:
    """Alarm values after each update of two scripted episodes that assign `tasks` tasks each."""
    alarms, out = SwarmAlarms(), []
    for tasks in tasks_by_update:
        episodes = [
            (await run_scripted(gateway, tasks, subagent, SwarmLimits(max_subagent_steps=1)))[0] for _ in range(2)
        ]
        out.append(alarms.update(swarm_metrics(episodes)))
    return out


async def test_serial_collapse_trips_when_the_orchestrator_stops_delegating(swarm_gateway, caplog):
    fired = await _updates(swarm_gateway, [2, 2, 0, 0, 0, 0], worker)
    assert [a["alarm/serial_collapse"] for a in fired] == [0, 0, 0, 0, 1, 1]
    assert not any(a["alarm/spawn_farming"] for a in fired)
    assert "swarm alarm: serial_collapse at update 5" in caplog.text


async def test_spawn_farming_trips_when_unfinished_sub_agents_rise(swarm_gateway):
    async def first_only(assignment, llm):  # only the first task of an episode finishes
        return await (worker if assignment.task == "item 0" else chatterbox)(assignment, llm)

    fired = await _updates(swarm_gateway, [1, 2, 3, 4, 5, 6], first_only)
    assert [a["alarm/spawn_farming"] for a in fired] == [0, 0, 0, 0, 0, 1]
    assert not any(a["alarm/serial_collapse"] for a in fired)
    healthy = await _updates(swarm_gateway, [3] * 6, worker)
    assert not any(any(a.values()) for a in healthy)


async def test_a_failed_episode_counts_the_sub_agents_its_call_tree_shows(swarm_gateway):
    """A timed-out episode has no outcome, so no swarm summary: counted as nothing it read as 'did not delegate'
    (spawn rate halved, a serial collapse faked) and its runs vanished from the unfinished ones."""
    limits = SwarmLimits(max_subagent_steps=1)
    finished, _, _ = await run_scripted(swarm_gateway, 2, worker, limits)
    failed, _, _ = await run_scripted(swarm_gateway, 3, worker, limits, failure="timeout after 120.0 s")
    assert failed.status == "failed" and not failed.outcome.info  # what the engine's failed episodes look like
    metrics = swarm_metrics([finished, failed])
    assert metrics["swarm/spawn_rate"] == 1.0 and metrics["swarm/assigned"] == (2 + 3) / 2
    assert metrics["swarm/unfinished"] == 3 / 2  # the failed episode's runs: their outputs went down with it
    assert metrics["swarm/finish_rate"] == 2 / 5 and metrics["swarm/failed_rate"] == 0.5
    alarms = SwarmAlarms()  # an update that delegated, then three whose episodes delegated and timed out
    fired = [alarms.update(swarm_metrics(batch))["alarm/serial_collapse"] for batch in [[finished]] + [[failed]] * 3]
    assert fired == [0, 0, 0, 0]
