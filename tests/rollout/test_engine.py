"""The rollout engine with a real harness (openai client, tools with latency) on the tiny model."""

import asyncio
import itertools
import json

import openai
import pytest

from harnessrl.gateway import GatewayClient, create_app
from harnessrl.gateway.client import GatewayError
from harnessrl.harness import Toolbox
from harnessrl.policy import Policy
from harnessrl.rewards import Reward, weighted
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.rollout.engine import _stale_episodes
from harnessrl.train import TrainConfig, Trainer
from harnessrl.types import Call, Episode, Outcome, Task

ADMIN = "rollout-admin-key"


async def get_time(city: str) -> str:
    """Local time in a city.

    Args:
        city: the city
    """
    await asyncio.sleep(0.05)  # a tool with latency
    return f"12:00 in {city}"


TOOLS = Toolbox([get_time])


async def harness(task: Task, llm: openai.AsyncOpenAI) -> Outcome:
    """An ordinary agent loop; tasks can ask it to crash or hang, as real harnesses sometimes do."""
    if task.data.get("crash"):
        raise RuntimeError("the harness hit a bug")
    if task.data.get("hang"):
        await asyncio.sleep(60)
    if task.data.get("timeout_error"):  # the harness's own timeout (a tool's socket), not the engine's
        raise TimeoutError("the weather API did not answer")
    if idle := task.data.get("idle"):  # e.g. a slow tool before the first call: the session may expire meanwhile
        await asyncio.sleep(idle)
    messages = [{"role": "user", "content": task.prompt}]
    answer = ""
    for turn in range(2):
        r = await llm.chat.completions.create(model="tiny", messages=messages, tools=TOOLS.schemas, max_tokens=8)
        message = r.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            result, _ = await TOOLS.call(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        answer = message.content or ""
        messages.append({"role": "user", "content": "go on"})
        if turn == 0:  # a slow tool between the two calls: the episode spans updates
            await asyncio.sleep(task.data.get("slow", 0))
    return Outcome(answer=answer)


@pytest.fixture
def setup():
    policy = Policy.load("tiny")
    gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN))
    reward = Reward(
        [weighted("e_share", lambda e: (e.outcome.answer or "").count("e") / max(1, len(e.outcome.answer or "")))]
    )
    yield policy, gateway, reward
    policy.close()


def test_a_group_records_failures_with_their_reasons_and_scores_them_negative(setup):
    policy, gateway, reward = setup
    engine = RolloutEngine(gateway, harness, reward, RolloutConfig(group_size=3, episode_timeout=60))
    impatient = RolloutEngine(gateway, harness, reward, RolloutConfig(group_size=3, episode_timeout=1.0))

    async def run():
        ok = await engine.group(Task(id="ok", prompt="Time in Oslo?"))
        crash = await engine.group(Task(id="crash", prompt="x", data={"crash": True}))
        hang = await impatient.group(Task(id="hang", prompt="x", data={"hang": True}))
        own = await impatient.group(Task(id="own", prompt="x", data={"timeout_error": True}))
        return ok, crash, hang, own

    ok, crash, hang, own = asyncio.run(run())
    assert all(e.failure_reason == "harness raised TimeoutError: the weather API did not answer" for e in own)
    assert all(e.status == "finished" and len(e.calls) == 2 and "e_share" in e.reward.terms for e in ok)
    assert all(
        e.status == "failed" and "harness raised RuntimeError: the harness hit a bug" == e.failure_reason for e in crash
    )
    assert all(
        e.failure_reason == "timeout after 1.0 s" and e.reward.total == -1.0 and e.reward.flags == ["failed"]
        for e in hang
    )
    assert engine.counts == {"episodes": 6, "failed": 3, "timeouts": 0, "dropped_stale": 0, "expired": 0}
    assert impatient.counts == {"episodes": 6, "failed": 6, "timeouts": 3, "dropped_stale": 0, "expired": 0}


async def test_a_group_whose_episode_cannot_start_leaves_no_sibling_running(setup, tmp_path):
    """The gateway's store refuses the second episode of a group (503): the others are cancelled and deleted, not
    run on for a group no one will score."""
    import sqlalchemy as sa

    from harnessrl.loop.store import Store

    class Refusing(Store):  # the real store, down for the second episode it is asked to create
        created = 0

        def add_episode(self, *args, **kwargs):
            self.created += 1
            if self.created == 2:
                raise sa.exc.OperationalError("INSERT INTO episodes", {}, Exception("database is locked"))
            super().add_episode(*args, **kwargs)

    policy, _, reward = setup
    gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN, recorder=Refusing(tmp_path / "t.db")))
    engine = RolloutEngine(gateway, harness, reward, RolloutConfig(group_size=4, episode_timeout=60))
    with pytest.raises(GatewayError, match="503"):
        await engine.group(Task(id="slow", prompt="x", data={"idle": 5}))
    await asyncio.sleep(0.2)
    running = [e for e in (await gateway._request("GET", "/v1/episodes"))["data"] if e["status"] == "running"]
    assert engine.counts["episodes"] == 0 and running == []
    await gateway.aclose()


async def test_a_gateway_error_at_finish_ends_the_run_and_is_not_the_harness_failing(setup, tmp_path):
    """The store is down when a successful episode finishes (503): that is the gateway's error, raised to the run, not
    an episode failed with "harness raised GatewayError" and scored as the harness's failure after a second finish."""
    import sqlalchemy as sa

    from harnessrl.loop.store import Store

    class Down(Store):  # the real store, down for the first finish it is asked to write
        finishes = 0

        def finish(self, episode):
            self.finishes += 1
            if self.finishes == 1:
                raise sa.exc.OperationalError("UPDATE episodes", {}, Exception("database is locked"))
            super().finish(episode)

    policy, _, reward = setup
    store = Down(tmp_path / "t.db")
    gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN, recorder=store))
    engine = RolloutEngine(gateway, harness, reward, RolloutConfig(group_size=2, episode_timeout=60))
    with pytest.raises(GatewayError, match="finish: 503"):
        await engine.episode(Task(id="ok", prompt="Time in Oslo?"))
    # the gateway's delete of the episode left unfinished ends it in the store
    reasons = [s.episode.failure_reason for s in store.episodes()]
    assert engine.counts["failed"] == 0 and not any("harness raised" in (r or "") for r in reasons), reasons
    await gateway.aclose()


@pytest.mark.parametrize("store", [False, True])
async def test_an_episode_its_gateway_expired_is_a_failed_episode_not_a_crash(tmp_path, store):
    """A gateway with a session TTL ends an idle episode: kept in memory as failed (409 on finish) or, with a trace
    store, moved there (404 on finish and on delete)."""
    from harnessrl.gateway.serving import EXPIRED
    from harnessrl.loop.store import Store

    recorder = Store(tmp_path / "t.db") if store else None
    # a TTL the idle episodes pass 3 times over, and the others' gaps between calls never near (0.2 s expired one
    # of them once, its worker beside a heavy test under the AVX2 settings)
    app = create_app(Policy.load("tiny"), ADMIN, recorder=recorder, session_ttl=0.6)
    reward = Reward([weighted("answered", lambda e: float(bool(e.outcome.answer)))])
    async with app.router.lifespan_context(app):
        engine = RolloutEngine(GatewayClient(ADMIN, app=app), harness, reward, RolloutConfig(group_size=2))
        idle = await engine.group(Task(id="idle", prompt="Time in Oslo?", data={"idle": 1.8}))
        ok = await engine.group(Task(id="ok", prompt="Time in Oslo?"))
    assert all(e.status == "failed" and e.reward.total == -1.0 for e in idle)
    reasons = {e.failure_reason for e in idle}
    if store:
        assert all(r.startswith("gone from the gateway") for r in reasons)
        assert all(recorder.get(e.id).failure_reason == EXPIRED for e in idle)
        recorder.close()
    else:
        assert reasons == {EXPIRED}
    assert all(e.status == "finished" for e in ok) and engine.counts["expired"] == 2
    app.state.serving.policy.close()


@pytest.mark.parametrize("staleness", [0, 1])
def test_training_runs_synchronously_and_with_a_staleness_bound(setup, tmp_path, staleness):
    policy, gateway, reward = setup
    config = RolloutConfig(group_size=4, groups_per_update=2, staleness=staleness, concurrency=8)
    engine = RolloutEngine(gateway, harness, reward, config)
    trainer = Trainer(policy.model, policy.tokenizer, TrainConfig(lr=1e-3), run_dir=tmp_path, policy=policy)
    tasks = itertools.cycle([Task(id=f"t{i}", prompt=f"Time in city {i}?") for i in range(4)])
    history = asyncio.run(engine.train(trainer, tasks, updates=3, progress=False))
    assert [m["step"] for m in history] == [1, 2, 3] and policy.version == 3
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert (
        len(lines) == 3
        and lines[-1]["rollout/total_episodes"] >= 24
        and lines[-1]["rollout/episodes"] == 8
        and "perf/rollout_wait_seconds" in lines[-1]
    )
    for m in history:  # every trained token was sampled at most k versions ago
        assert m.get("policy/staleness", 0) <= staleness
    # admission keeps at most k x groups_per_update groups ahead: none sampled in vain, none waiting
    assert engine.counts["dropped_stale"] == 0
    # an on_update that returns True ends training after that update (a job's time budget)
    seen = []
    stopped = asyncio.run(
        engine.train(
            trainer, tasks, 3, progress=False, on_update=lambda _, episodes: seen.append(len(episodes)) or True
        )
    )
    assert len(stopped) == 1 and seen == [8] and policy.version == 4


@pytest.mark.parametrize("staleness", [0, 1])
def test_refill_samples_more_groups_while_too_few_are_informative(setup, tmp_path, staleness):
    policy, gateway, _ = setup
    # tied tasks score 0 for every episode (the trainer drops such a group); t3, t7, ... score their logprob sum
    reward = Reward([weighted("logp", lambda e: 0.0 if e.task.data.get("tie") else sum(e.calls[0].sampled_logprobs))])
    tasks = itertools.cycle([Task(id=f"t{i}", prompt=f"Time in city {i}?", data={"tie": i != 3}) for i in range(4)])
    trainer = Trainer(policy.model, policy.tokenizer, TrainConfig(lr=1e-3), run_dir=tmp_path, policy=policy)
    config = RolloutConfig(group_size=2, groups_per_update=2, staleness=staleness, concurrency=8, refill_rounds=1)
    (refilled,) = asyncio.run(RolloutEngine(gateway, harness, reward, config).train(trainer, tasks, 1, progress=False))
    # groups are taken in the order they started (the tasks' order): t0, t1 tie, so a refill round takes t2 (tied) and
    # t3 (informative) and stops at its cap: 4 groups
    assert refilled["rollout/groups"] == 4 and refilled["rollout/groups_dropped_equal"] == 3
    config = config.model_copy(update={"refill_rounds": 0})
    (plain,) = asyncio.run(RolloutEngine(gateway, harness, reward, config).train(trainer, tasks, 1, progress=False))
    assert plain["rollout/groups"] == 2  # no refill: one round, however few are informative
    if staleness == 0:  # synchronous rounds take the tasks in order: t4, t5 (ties)
        assert plain["rollout/groups_dropped_equal"] == 2


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_guided_group_trains_its_demonstration_beside_the_samples_and_it_never_goes_stale(setup, tmp_path, staleness):
    policy, gateway, reward = setup
    tasks = [Task(id=f"t{i}", prompt=f"Time in city {i}?") for i in range(4)]
    probe = RolloutEngine(gateway, harness, reward, RolloutConfig(group_size=2))
    guides = {}
    for task in tasks:  # an expert's episode per task: recorded at version 0, its tokens never sampled
        demo = asyncio.run(probe.group(task))[0]
        for call in demo.calls:
            call.demonstration, call.sampled_logprobs = True, [0.0] * len(call.completion_ids)
        guides[task.id] = demo
    config = RolloutConfig(group_size=4, groups_per_update=2, staleness=staleness, concurrency=8)
    engine = RolloutEngine(gateway, harness, reward, config, guides)
    group = asyncio.run(engine.group(tasks[0]))
    assert len(group) == 5 and group[-1].demonstrated and group[-1].id != guides["t0"].id and group[-1].reward
    trainer = Trainer(policy.model, policy.tokenizer, TrainConfig(lr=1e-3), run_dir=tmp_path, policy=policy)
    history = asyncio.run(engine.train(trainer, itertools.cycle(tasks), updates=3, progress=False))
    assert engine.counts["dropped_stale"] == 0  # the demonstrations' version 0 is not an age
    for m in history:  # the metrics are the sampled episodes'; every group trains its demonstration
        assert m["rollout/episodes"] == 8 and m["rollout/demonstrations"] == 2
        assert 0 < m["policy/guided_p"] < 1


def test_a_slow_group_is_trained_on_not_overtaken_and_dropped_as_stale(setup):
    """Groups are taken in the order they started: a slow one (a long tool call after its first model call) holds
    its batch back instead of being overtaken by later groups for two updates and dropped as stale."""
    policy, gateway, reward = setup
    slow = Task(id="slow", prompt="Time in Oslo?", data={"slow": 4.0})
    tasks = itertools.chain([slow], itertools.cycle([Task(id=f"t{i}", prompt=f"Time in city {i}?") for i in range(3)]))
    config = RolloutConfig(group_size=2, groups_per_update=2, staleness=1, concurrency=8)
    engine = RolloutEngine(gateway, harness, reward, config)
    trainer = Trainer(policy.model, policy.tokenizer, TrainConfig(lr=1e-3), policy=policy)
    trained = []
    asyncio.run(
        engine.train(
            trainer, tasks, 3, progress=False, on_update=lambda _, eps: trained.append({e.task.id for e in eps})
        )
    )
    assert engine.counts["dropped_stale"] == 0 and "slow" in trained[0]


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_tasks_iterator_that_runs_out_says_so(setup, staleness):
    policy, gateway, reward = setup
    engine = RolloutEngine(
        gateway, harness, reward, RolloutConfig(group_size=2, groups_per_update=2, staleness=staleness)
    )
    trainer = Trainer(policy.model, policy.tokenizer, TrainConfig(lr=1e-3), policy=policy)
    with pytest.raises(RuntimeError, match=r"the tasks iterator is exhausted .*itertools.cycle"):
        asyncio.run(engine.train(trainer, iter([Task(prompt="Time in Oslo?")] * 3), 2, progress=False))


def test_a_stale_group_counts_its_sampled_episodes_not_its_demonstration():
    def episode(version: int, demonstration: bool = False) -> Episode:
        call = Call(prompt_ids=[1], completion_ids=[2], sampled_logprobs=[0.0], policy_version=version,
                    demonstration=demonstration)  # fmt: skip
        return Episode(calls=[call], status="finished")

    group = [episode(0), episode(1), episode(0, demonstration=True)]
    assert _stale_episodes(group, current=2, staleness=1) == 2  # the demonstration is no episode sampled in vain
    assert _stale_episodes(group, current=1, staleness=1) == 0
    assert _stale_episodes(group[2:] + [Episode(status="failed")], current=9, staleness=1) == 0  # nothing sampled
