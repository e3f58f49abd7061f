import pytest

from harnessrl.job.config import JobConfig
from harnessrl.rewards import Reward, Schedule, Term, anneal_to_zero, constant, weighted
from harnessrl.rewards.compose import TermFailure
from harnessrl.types import Episode, Outcome


def test_schedules_by_hand():
    assert constant(0.3).value(1000) == 0.3
    linear = Schedule(kind="linear", start=1.0, end=0.0, steps=100)
    assert [linear.value(s) for s in (0, 25, 100, 500)] == [1.0, 0.75, 0.0, 0.0]
    cosine = Schedule(kind="cosine", start=1.0, end=0.2, steps=10)
    assert cosine.value(0) == 1.0 and cosine.value(5) == pytest.approx(0.6) and cosine.value(10) == pytest.approx(0.2)
    step = Schedule(kind="step", start=1.0, boundaries=[10, 20], values=[0.5, 0.1])
    assert [step.value(s) for s in (0, 9, 10, 19, 20, 99)] == [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]
    anneal = anneal_to_zero(0.2, by_step=50)
    assert anneal.value(0) == 0.2 and anneal.value(25) == pytest.approx(0.1) and anneal.value(50) == 0.0
    with pytest.raises(ValueError, match="boundaries"):
        Schedule(kind="step", boundaries=[20, 10], values=[1, 2])


def test_a_schedule_refuses_fields_its_kind_does_not_read(tmp_path):
    # without `kind` this was a constant 1.0: the anneal silently never happened
    with pytest.raises(ValueError, match=r"a constant schedule reads start, not steps \(kind is constant when not"):
        Schedule(start=1.0, end=0.0, steps=100)
    with pytest.raises(ValueError, match="a linear schedule reads start, end, steps, not boundaries, values"):
        Schedule(kind="linear", steps=10, boundaries=[5], values=[0.5])
    with pytest.raises(ValueError, match="a step schedule reads start, boundaries, values, not end"):
        Schedule(kind="step", end=0.5, boundaries=[5], values=[0.5])
    dumped = anneal_to_zero(0.1, 8).model_dump(mode="json")  # as a run's config.yaml holds it: every field
    assert Schedule(**dumped) == anneal_to_zero(0.1, 8) and Schedule(start=0.3) == constant(0.3)
    # a job config's schedule of another kind does not inherit the default anneal's steps (which it would refuse)
    config = tmp_path / "job.yaml"
    config.write_text("swarm: {lambda_parallel: {kind: constant, start: 0.2}, lambda_finish: {start: 0.3}}\n")
    swarm = JobConfig.load(config).swarm
    assert swarm.lambda_parallel == constant(0.2) and swarm.lambda_finish == anneal_to_zero(0.3, 8)


def _episode(answer: str, success: bool) -> Episode:
    return Episode(outcome=Outcome(answer=answer, success=success))


def test_breakdown_names_every_term_and_its_weight_at_the_step():
    reward = Reward([
        weighted("outcome", lambda e: float(e.outcome.success)),
        weighted("format", lambda e: 1.0, anneal_to_zero(0.2, by_step=100)),
    ])  # fmt: skip
    early, late = reward.score(_episode("x", True), step=0), reward.score(_episode("x", True), step=100)
    assert early.terms == {"outcome": 1.0, "format": 0.2} and early.total == 1.2
    assert late.terms == {"outcome": 1.0, "format": 0.0} and late.weights == {"outcome": 1.0, "format": 0.0}


def test_gates_caps_clamp_and_flags():
    reward = Reward(
        [
            Term("outcome", lambda e: float(e.outcome.success), 1.0),
            Term("bonus", lambda e: 1.0, 0.5, gate="outcome"),  # only when the outcome passes
            Term("judge", lambda e: 1.0, 2.0, cap="outcome"),  # never above the outcome term
            Term("repetition", lambda e: 0.5, -1.0, flag=True),
        ],
        clamp=(-1.0, 1.5),
    )
    won, lost = reward.score(_episode("a", True)), reward.score(_episode("b", False))
    # the clamp took 0.5 off 2.0: its own entry, so the terms sum to the total
    assert won.terms == {"outcome": 1.0, "bonus": 0.5, "judge": 1.0, "repetition": -0.5, "clamp": -0.5}
    assert lost.terms == {"outcome": 0.0, "bonus": 0.0, "judge": 0.0, "repetition": -0.5, "clamp": 0.0}
    assert (won.total, lost.total) == (1.5, -0.5) and all(sum(b.terms.values()) == b.total for b in (won, lost))
    assert won.flags == ["repetition"]
    with pytest.raises(ValueError, match="unknown term 'missing'"):
        Reward([Term("a", lambda e: 0.0, gate="missing")])
    with pytest.raises(ValueError, match="records it as the term 'clamp'"):
        Reward([Term("clamp", lambda e: 0.0)], clamp=(-1.0, 1.0))


def test_a_clamped_penalty_shows_in_the_breakdown():
    # a penalty below the floor was swallowed without trace: the terms summed to -1.7, the total said -1.0
    reward = Reward([Term("outcome", lambda e: 0.0), Term("tampering", lambda e: 1.0, -1.5),
                     Term("turns", lambda e: 0.2, -1.0)], clamp=(-1.0, 2.0))  # fmt: skip
    scored = reward.score(_episode("x", False))
    assert scored.total == -1.0 and scored.terms["clamp"] == pytest.approx(0.7)
    assert sum(scored.terms.values()) == pytest.approx(scored.total)


async def test_async_and_group_terms_get_the_step_when_they_ask_for_it():
    async def annealed(episode, step):
        return 1.0 - step / 100

    async def group_annealed(episodes, step):
        return [step / 100] * len(episodes)

    reward = Reward([Term("each", annealed, with_step=True), Term("group", group_annealed, group=True, with_step=True)])
    (scored,) = await reward.score_group([_episode("x", True)], step=25)
    assert scored.values == {"each": 0.75, "group": 0.25} and scored.failure is None


def test_gates_then_caps_whatever_the_order_of_the_terms():
    judge = Term("judge", lambda e: 1.0, 0.3, cap="outcome")  # paid 0.3 above a gated-out outcome before the fix
    outcome = Term("outcome", lambda e: float(e.outcome.success), gate="format")
    style = Term("style", lambda e: 1.0, 0.2, cap="judge")  # a cap of a capped term
    fmt = Term("format", lambda e: 0.0)
    for terms in ([judge, outcome, style, fmt], [fmt, style, outcome, judge], [style, judge, fmt, outcome]):
        scored = Reward(terms).score(_episode("a", True))
        assert scored.terms == {"judge": 0.0, "outcome": 0.0, "style": 0.0, "format": 0.0}, [t.name for t in terms]
    with pytest.raises(ValueError, match="caps form a cycle: a -> b -> a"):
        Reward([Term("a", lambda e: 0.0, cap="b"), Term("b", lambda e: 0.0, cap="a")])


async def test_a_non_finite_term_is_a_failed_term_whatever_the_episodes_order():
    """A NaN (or inf) would make every advantage of its group NaN: the term failed, as one that raises."""
    reward = Reward([weighted("outcome", lambda e: float(e.outcome.success)),
                     weighted("judge", lambda e: float(e.outcome.answer))])  # fmt: skip
    for answers in (["nan", "1.0"], ["1.0", "nan"], ["inf", "1.0"]):
        scored = await reward.score_group([_episode(a, True) for a in answers])
        assert all(s.failure and s.failure.startswith("judge: returned") for s in scored), scored
        assert all(s.total == 1.0 and s.values["judge"] == 0.0 for s in scored)
    single = reward.score(_episode("nan", True))
    assert single.failure.startswith("judge: returned nan") and single.total == 1.0


async def test_every_failed_term_is_named():
    def fails(why):
        def term(e):
            raise TermFailure(why)

        return term

    reward = Reward([weighted("a", fails("timed out")), weighted("ok", lambda e: 1.0), weighted("b", fails("bad"))])
    (scored,) = await reward.score_group([_episode("x", True)])
    assert scored.failure == "a: timed out; b: bad" and scored.total == 1.0
    assert reward.score(_episode("x", True)).failure == "a: timed out; b: bad"


def test_a_weight_or_clamp_that_is_not_finite_is_refused_when_the_reward_is_built():
    with pytest.raises(ValueError, match="term 'x': weight nan is not a finite number"):
        Reward([Term("x", lambda e: 1.0, float("nan"))])
    with pytest.raises(ValueError, match="term 'x': weight inf"):
        Reward([Term("x", lambda e: 0.0, float("inf"))])  # inf x 0 made every total NaN
    with pytest.raises(ValueError, match="finite number"):
        Schedule(start=float("nan"))
    for clamp in ((1.0, -1.0), (float("nan"), 1.0)):
        with pytest.raises(ValueError, match="not \\(low, high\\)"):
            Reward([Term("x", lambda e: 1.0)], clamp=clamp)


async def test_a_term_that_returns_no_number_or_raises_names_itself():
    reward = Reward([weighted("ok", lambda e: True), weighted("forgot", lambda e: None)])
    with pytest.raises(TypeError, match="returned None, not a number") as caught:
        reward.score(_episode("x", True))
    assert "in reward term 'forgot'" in caught.value.__notes__
    with pytest.raises(TypeError) as caught:
        await reward.score_group([_episode("x", True)])
    assert "in reward term 'forgot'" in caught.value.__notes__
    assert Reward([weighted("ok", lambda e: True)]).score(_episode("x", True)).total == 1.0  # a bool counts 1
