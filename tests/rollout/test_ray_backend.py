"""`rollout.backend: ray` on a local Ray instance (2 CPUs): same episodes, same failure semantics, dead
workers retried on fresh episodes; and the default backend never imports Ray."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from harnessrl.gateway import BackgroundServer, GatewayClient, create_app
from harnessrl.policy import Policy
from harnessrl.rewards import Reward, weighted
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.types import Outcome, Task

ray = pytest.importorskip("ray")
ADMIN = "ray-backend-admin-key"


async def harness(task: Task, llm: openai.AsyncOpenAI) -> Outcome:
    """Two chat calls over HTTP from the worker; tasks may crash it, kill its process once, or hang."""
    if task.data.get("crash"):
        raise ValueError("the harness hit a bug")
    marker = task.data.get("die_once")
    if marker and not Path(marker).exists():
        Path(marker).write_text(str(os.getpid()))
        await asyncio.sleep(task.data.get("die_after", 0))  # the worker's other episodes run on meanwhile
        os._exit(1)  # the worker process dies mid-episode, after its first attempt began
    if task.data.get("hang"):
        await asyncio.sleep(60)
    if task.data.get("no_outcome"):  # a harness that reports nothing: an empty Outcome, as in process
        return None
    await asyncio.sleep(task.data.get("idle", 0))
    messages = [{"role": "user", "content": task.prompt}]
    for _ in range(2):
        reply = await llm.chat.completions.create(model="tiny", messages=messages, max_tokens=6)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    return Outcome(answer=reply.choices[0].message.content or "", info={"worker_pid": os.getpid()})


@pytest.fixture(scope="module")
def served():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    policy = Policy.load("tiny")
    with BackgroundServer(create_app(policy, ADMIN)) as server:
        yield server.base_url
    policy.close()
    ray.shutdown()


async def _engine(base_url: str, run=harness, **config) -> RolloutEngine:
    gateway = GatewayClient(ADMIN, base_url=base_url)
    reward = Reward([weighted("length", lambda e: len(e.outcome.answer or "") / 100)])
    cfg = RolloutConfig(**{"backend": "ray", "workers": 2, "worker_concurrency": 4, "group_size": 4} | config)
    return RolloutEngine(gateway, run, reward, cfg)


async def test_episodes_run_on_workers_token_exact(served):
    engine = await _engine(served)
    episodes = await engine.group(Task(prompt="hello"))
    assert [e.status for e in episodes] == ["finished"] * 4
    assert all(len(e.calls) == 2 and e.reward is not None for e in episodes)
    for e in episodes:  # the second call's prompt extends the first call's prompt + sampled ids
        first, second = e.calls
        assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == (
            first.prompt_ids + first.completion_ids
        )
    assert {e.outcome.info["worker_pid"] for e in episodes} != {os.getpid()}
    engine.close()
    await engine.gateway.aclose()


async def test_failures_are_data_as_in_process(served):
    engine = await _engine(served, episode_timeout=30)  # the crash must end within it on a loaded 2-core machine
    await asyncio.gather(*(engine.episode(Task(prompt="warm up")) for _ in range(2)))  # both workers started
    crashed, hung = await asyncio.gather(
        engine.episode(Task(prompt="x", data={"crash": True})), engine.episode(Task(prompt="x", data={"hang": True}))
    )
    assert crashed.status == "failed" and crashed.failure_reason == "harness raised ValueError: the harness hit a bug"
    assert hung.status == "failed" and hung.failure_reason == "timeout after 30.0 s"
    engine.close()
    await engine.gateway.aclose()


async def test_a_dead_worker_is_retried_on_a_fresh_episode(served, tmp_path):
    engine = await _engine(served, worker_retries=1)
    episode = await engine.episode(Task(prompt="x", data={"die_once": str(tmp_path / "died")}))
    assert episode.status == "finished" and len(episode.calls) == 2  # nothing of the dead attempt
    assert engine.counts["worker_deaths"] == 1 and engine.counts["worker_retries"] == 1
    no_retry = await _engine(served, worker_retries=0)
    failed = await no_retry.episode(Task(prompt="x", data={"die_once": str(tmp_path / "died-again")}))
    assert failed.status == "failed" and failed.failure_reason.startswith("rollout worker")
    assert "died" in failed.failure_reason
    listed = await engine.gateway._request("GET", "/v1/episodes")
    assert listed["data"] == []  # every attempt's episode was deleted from the gateway
    for e in (engine, no_retry):
        e.close()
        await e.gateway.aclose()


async def test_a_worker_that_dies_under_two_episodes_is_one_death(served, tmp_path):
    engine = await _engine(served, workers=1, worker_retries=1)
    dying = Task(prompt="x", data={"die_once": str(tmp_path / "died"), "die_after": 1.0})
    episodes = await asyncio.gather(engine.episode(dying), engine.episode(Task(prompt="y", data={"idle": 3.0})))
    assert [e.status for e in episodes] == ["finished"] * 2
    assert engine.counts["worker_deaths"] == 1 and engine.counts["worker_retries"] == 2  # one worker, two episodes
    engine.close()
    await engine.gateway.aclose()


async def test_a_harness_that_returns_no_outcome_finishes_as_in_process(served):
    engine = await _engine(served)
    episode = await engine.episode(Task(prompt="x", data={"no_outcome": True}))
    assert episode.status == "finished" and episode.outcome is not None and episode.outcome.answer is None
    engine.close()
    await engine.gateway.aclose()


async def test_a_partial_of_a_harness_runs_on_the_workers(served):
    """functools.partial(harness, ...) was unpicklable: its module, functools, was registered to ship by value."""
    engine = await _engine(served, functools.partial(_answering, answer="y"), workers=1)
    episode = await engine.episode(Task(prompt="x"))
    assert episode.status == "finished" and episode.outcome.answer == "y", episode.failure_reason
    engine.close()
    await engine.gateway.aclose()


async def _answering(task: Task, llm: openai.AsyncOpenAI, answer: str) -> Outcome:
    return Outcome(answer=answer)


def test_the_ray_backend_needs_an_http_gateway(served):
    with pytest.raises(ValueError, match="needs the gateway over HTTP"):
        RolloutEngine(GatewayClient(ADMIN, app=create_app(Policy.load("tiny"), ADMIN)), harness, Reward([]),
                      RolloutConfig(backend="ray"))  # fmt: skip


def test_the_default_backend_never_imports_ray():
    code = "import sys, harnessrl.rollout, harnessrl.job.main, harnessrl.cli; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
