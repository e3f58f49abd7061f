"""Reward from feedback (penalties never filtered out) and the gate's pure decision, by hand."""

from __future__ import annotations

import re

import pytest

from harnessrl.loop.feedback import FeedbackMap, feedback_reward
from harnessrl.loop.gate import GateConfig, Side, decide, paired_lower_bound
from harnessrl.loop.store import Feedback, StoredEpisode
from harnessrl.types import Call, Episode, Outcome


def _stored(answer: str = "sunny", signals=(), malformed: bool = False) -> StoredEpisode:
    call = Call(prompt_ids=[1], completion_ids=[2], sampled_logprobs=[-1.0], policy_version=1,
                tool_call_error="bad JSON" if malformed else None)  # fmt: skip
    episode = Episode(calls=[call, call.model_copy(update={"tool_call_error": None})], outcome=Outcome(answer=answer))
    feedback = [Feedback(0, s, v, 0.0) for s, v in signals]
    return StoredEpisode(episode, "weather", 1, 0.0, feedback)


def test_signals_map_to_reward_and_hacks_are_priced():
    mapping = FeedbackMap()
    assert feedback_reward(_stored(), mapping) is None  # unlabelled: counted by the cycle, not trained on
    reward = feedback_reward(_stored(signals=[("accepted", None), ("scalar", -0.5)]), mapping)
    assert reward.total == pytest.approx((1.0 - 0.5) / 2) and reward.flags == []
    broken = feedback_reward(_stored(malformed=True), mapping)  # no feedback, yet labelled: never filtered out
    assert broken.total == pytest.approx(-1.0 * 0.5) and broken.flags == ["malformed_tool_call"]
    deferred = feedback_reward(_stored(answer="Which city do you mean?", signals=[("accepted", None)]), mapping)
    assert deferred.total == pytest.approx(1.0 - 0.5) and deferred.flags == ["clarifying_question"]


def test_paired_lower_bound():
    assert paired_lower_bound([0.2] * 10, 0.9, 500) == pytest.approx(0.2)
    spread = [-1.0, 1.0] * 10
    assert paired_lower_bound(spread, 0.9, 2000) < 0 < paired_lower_bound([x + 0.5 for x in spread], 0.9, 2000) + 0.5


def _side(scores, validity=1.0, clarifying=0.0, tokens=10.0, failed=0.0) -> Side:
    return Side(dict(enumerate(scores)), validity, clarifying, tokens, failed)


def test_the_gate_needs_the_bound_and_every_canary():
    config = GateConfig(margin=0.05)
    current = _side([0.5, 0.6, 0.4, 0.5])
    assert decide(_side([0.6, 0.7, 0.5, 0.6]), current, config)["promote"]
    worse = decide(_side([0.1, 0.2, 0.0, 0.1]), current, config)
    assert not worse["promote"] and "paired lower bound" in worse["reasons"][0]
    hack = decide(_side([0.6, 0.7, 0.5, 0.6], clarifying=0.5), current, config)
    assert hack["reasons"] == ["canary clarifying_rate failed"]
    broken = decide(_side([0.6, 0.7, 0.5, 0.6], validity=0.8, tokens=40.0), current, config)
    assert broken["reasons"] == ["canary tool_call_validity failed", "canary response_length failed"]
    # both versions fail every episode (scored 0): the tie above the bound is no evidence
    dead = decide(_side([0.0] * 4, failed=1.0), _side([0.0] * 4, failed=1.0), config)
    assert not dead["promote"] and dead["reasons"] == [
        "the candidate finished 0% of its episodes (min_finished 50%): its scores are of failures"
    ]
    flaky = decide(_side([0.6, 0.7, 0.5, 0.6], failed=0.25), current, config)  # better scores, more failures
    assert flaky["reasons"] == ["canary failed_share failed"] and flaky["canary_figures"]["failed_share"] == {
        "candidate": 0.25,
        "current": 0.0,
    }


def test_stale_samples_are_refused_or_kept_and_every_episode_is_counted(tmp_path):
    from harnessrl.loop.cycle import BenchmarkConfig, LoopConfig, collect
    from harnessrl.loop.store import Store

    store = Store(tmp_path / "t.db")
    for version, signal, status in [(2, "accepted", "finished"), (2, None, "finished"), (1, "rejected", "finished"),
                                    (2, None, "running"), (2, "edited", "failed")]:  # fmt: skip
        episode = Episode(outcome=Outcome(answer="sunny"))
        store.add_episode(episode, "weather", version)
        call = Call(prompt_ids=[1], completion_ids=[2, 3], sampled_logprobs=[-1.0, -2.0], policy_version=version)
        store.add_calls(episode.id, [(0, call, None)])
        store.finish(episode.model_copy(update={"status": status}))
        if signal:
            store.add_feedback(episode.id, None, signal, None)
    broken = Episode(outcome=Outcome(answer="sunny"))  # a call extending one that is not there: no valid episode
    store.add_episode(broken, "weather", 2)
    bad = Call(prompt_ids=[1], completion_ids=[2], sampled_logprobs=[-1.0], policy_version=2, extends_call=3)
    store.add_calls(broken.id, [(0, bad, None)])
    store.finish(broken.model_copy(update={"status": "finished"}))
    store.add_feedback(broken.id, None, "accepted", None)
    with pytest.raises(ValueError, match=f"episode {broken.id}: calls.0.extends_call: 3 is not an earlier call"):
        store.episodes(ended=True)
    config = LoopConfig(registry=tmp_path, harness="x:y", benchmark=BenchmarkConfig(tasks=tmp_path, score="x:y"))
    used, counts = collect(config, store, "weather", 2, 0.0, 1e12)
    assert [e.reward.total for e in used] == [1.0]
    assert counts == {"episodes": 5, "unreadable": 1, "expired": 0, "unfinished": 1, "failed": 1, "finished": 3,
                      "unlabelled": 1, "stale": 1, "labelled_used": 1, "off_policy_share": 0.5}  # fmt: skip
    config.stale = "correct"  # kept: the loss's ratio against the recorded sampled logprobs corrects them
    used, counts = collect(config, store, "weather", 2, 0.0, 1e12)
    assert sorted(e.reward.total for e in used) == [-1.0, 1.0] and counts["stale"] == 1
    assert used[0].calls[0].sampled_logprobs == [-1.0, -2.0]
    store.close()


async def test_a_score_that_raises_or_is_no_number_in_0_1_names_benchmark_score_and_the_item():
    from harnessrl.loop.gate import run_benchmark
    from harnessrl.policy import Policy
    from harnessrl.types import Task

    async def harness(task, llm):  # answers without the model: only the score is under test
        return Outcome(answer="sunny")

    def broken(episode):
        raise KeyError("city")

    policy, items, config = Policy.load("tiny"), [Task(id="oslo", prompt="q")], GateConfig(repeats=1)
    try:
        assert (await run_benchmark(policy, harness, items, lambda e: 1, config)).scores == {"oslo": 1.0}
        for score, said in [
            (broken, "benchmark.score failed on item 'oslo': KeyError: 'city'"),
            (lambda e: float("nan"), "benchmark.score returned nan for item 'oslo': expected a number in [0, 1]"),
            (lambda e: 1.5, "benchmark.score returned 1.5 for item 'oslo'"),
            (lambda e: "0.5", "benchmark.score returned '0.5' for item 'oslo'"),
        ]:
            with pytest.raises(ValueError, match=re.escape(said)):
                await run_benchmark(policy, harness, items, score, config)
    finally:
        policy.close()
