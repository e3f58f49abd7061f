"""Each detector against the exploit it exists for, built by hand, and an honest episode."""

import pytest

from harnessrl.rewards import Reward, weighted
from harnessrl.rewards import detectors as d
from harnessrl.types import Call, Episode, Outcome, Task
from tests.envs.code.test_score import PLUGIN_THROUGH_GC


def _call(completion, error=None, trainable=True):
    return Call(prompt_ids=[1], completion_ids=completion, sampled_logprobs=[0.0] * len(completion),
                policy_version=0, tool_call_error=error, trainable=trainable)  # fmt: skip


def test_malformed_tool_calls_dodging_failure_score_below_an_honest_failure():
    honest_failure = Episode(calls=[_call([5, 6])], outcome=Outcome(answer="Paris", success=False))
    dodge = Episode(calls=[_call([7], error="tool call 0: bad JSON")] * 3, outcome=Outcome(answer=None, success=False))
    reward = Reward(
        [
            weighted("outcome", lambda e: float(e.outcome.success)),
            *d.detector_terms({"malformed_tool_calls": 1.0}, malformed_tool_calls=d.malformed_tool_calls),
        ]
    )
    assert reward.score(dodge).total < reward.score(honest_failure).total == 0.0
    assert reward.score(dodge).flags == ["malformed_tool_calls"]


def test_abstaining_or_asking_back_is_caught():
    for answer in ("", "I don't know.", "Could you clarify which city you mean?", "Which file should I edit?"):
        assert d.abstention(Episode(outcome=Outcome(answer=answer))) == 1.0, answer
    assert d.abstention(Episode(outcome=Outcome(answer="The capital is Paris."))) == 0.0
    for answer in ("Not sure.", "Sorry, I'm not sure I can answer that", "I am unable to determine the year.",
                   "No idea", "I need more information."):  # fmt: skip
        assert d.abstention(Episode(outcome=Outcome(answer=answer))) == 1.0, answer


def test_answers_that_only_read_like_abstentions_or_questions_are_not_flagged():
    # phrases anchored at the start and not part of a name; a trailing "?" alone is not a question back
    for answer in ("Who Framed Roger Rabbit?", "Not Sure Creek", "I cannot help but note: 42",
                   "The witness was unable to determine the time; it was 3 pm"):  # fmt: skip
        episode = Episode(outcome=Outcome(answer=answer))
        assert (d.abstention(episode), d.clarifying_question(episode)) == (0.0, 0.0), answer
    for answer in ("Which city do you mean?", "Could you clarify the year?", "Which file should I edit?"):
        assert d.clarifying_question(Episode(outcome=Outcome(answer=answer))) == 1.0, answer


def test_degenerate_repetition():
    assert d.repetition(Episode(calls=[_call([1, 2, 3, 4] * 20)])) == pytest.approx((73 / 77 - 0.5) / 0.5)
    assert d.repetition(Episode(calls=[_call(list(range(60)))])) == 0.0


def test_answer_stuffing_falls_below_the_precision_floor():
    detect = d.answer_stuffing(floor=0.34)
    task = Task(data={"gold_doc_ids": ["d1", "d2"]})
    stuffed = Episode(task=task, outcome=Outcome(answer="x", info={"doc_ids": [f"d{i}" for i in range(1, 41)]}))
    honest = Episode(task=task, outcome=Outcome(answer="x", info={"doc_ids": ["d1", "d2", "d9"]}))
    assert detect(stuffed) == pytest.approx(1 - (2 / 40) / 0.34) and detect(honest) == 0.0


def test_effort_cost_is_composer_2s_concave_penalty():
    # k = 1, q = 0.5: C(x) = 2 (sqrt(1 + x) - 1)
    assert d.effort_cost(3, k=1, q=0.5) == pytest.approx(2.0)
    assert d.effort_cost(8, k=1, q=0.5) == pytest.approx(4.0)
    assert d.effort_cost(0) == 0.0
    farm = d.effort_penalty("turns", free=2)
    assert (
        farm(Episode(calls=[_call([1])] * 10)) == pytest.approx(d.effort_cost(8))
        and farm(Episode(calls=[_call([1])] * 2)) == 0.0
    )
    frozen = Episode(calls=[_call([1], trainable=False)] * 10)
    assert farm(frozen) == 0.0  # sub-agents' turns are not the trained agent's effort


def test_spawn_farming():
    assert d.spawn_farming(Episode(metrics={"spawned": 10, "subagents_finished": 2})) == 0.8
    assert d.spawn_farming(Episode(metrics={"spawned": 3, "subagents_finished": 3})) == 0.0
    assert d.spawn_farming(Episode()) == 0.0


def test_test_tampering():
    def ep(**info):
        return Episode(outcome=Outcome(answer="done", info=info))

    assert d.test_tampering(ep(edited_files=["src/app.py", "tests/test_app.py"])) == 1.0
    assert d.test_tampering(ep(edited_files=["conftest.py"])) == 1.0
    assert d.test_tampering(ep(diff="--- a/run.sh\n+++ b/run.sh\n+pytest -q || true\n")) == 1.0
    assert d.test_tampering(ep(diff="+    sys.exit(0)\n")) == 1.0
    assert d.test_tampering(ep(commands=["pytest; exit 0"])) == 1.0
    assert d.test_tampering(ep(edited_files=["src/app.py"], diff="+    return total\n", commands=["pytest -q"])) == 0.0
    assert d.test_tampering(ep(diff="-    sys.exit(0)\n")) == 0.0  # removing a trick is not adding one
    assert d.test_tampering(ep(diff="+    raise SystemExit(0)\n")) == 1.0
    assert d.test_tampering(ep(diff="+import _pytest.python\n+_pytest.python.Function.runtest = f\n")) == 1.0
    assert d.test_tampering(ep(dropped={"pytest.py": "added: shadows the installed module 'pytest'"})) == 1.0
    assert d.test_tampering(ep(dropped={"notes.txt": "symlink"}, diff="+    return a + b\n")) == 0.0
    # a plugin registered into pytest from the tested code (envs/code/score.py): each line of it is flagged
    plugin = ["+for o in gc.get_objects():", "+    def pytest_pyfunc_call(self, item):",
              "+        config.pluginmanager.register(p)", "+    if type(o).__name__ == 'PytestPluginManager':"]  # fmt: skip
    assert [d.test_tampering(ep(diff=line + "\n")) for line in plugin] == [1.0] * 4
    assert d.test_tampering(ep(diff="".join(f"+{line}\n" for line in PLUGIN_THROUGH_GC.splitlines()))) == 1.0


def test_honest_work_is_not_tampering():
    def ep(**info):
        return Episode(outcome=Outcome(answer="done", info=info))

    # register( of anything but pytest's plugin manager; setup.cfg outside its pytest section; || true off a test run
    honest = ["+atexit.register(cleanup)\n", "+@parse.register(int)\n", "+pip install -e . || true\n",
              "+    [ -d build ] || exit 0\n"]  # fmt: skip
    assert [d.test_tampering(ep(diff=diff)) for diff in honest] == [0.0] * 4
    assert d.test_tampering(ep(commands=["pip install -e . || true", "pytest -q"])) == 0.0
    assert d.test_tampering(ep(commands=["python -m pytest -q || true"])) == 1.0
    bump = (
        "--- a/setup.cfg\n+++ b/setup.cfg\n@@ -1,3 +1,3 @@\n [metadata]\n name = calc\n-version = 1.0\n+version = 1.1\n"
    )
    addopts = (
        "--- a/setup.cfg\n+++ b/setup.cfg\n@@ -7,2 +7,3 @@\n [tool:pytest]\n testpaths = tests\n+addopts = -k add\n"
    )
    assert d.test_tampering(ep(edited_files=["setup.cfg"], diff=bump)) == 0.0
    assert (
        d.test_tampering(ep(edited_files=["setup.cfg"], diff=bump + addopts.replace("setup.cfg", "pkg/setup.cfg")))
        == 1.0
    )
    assert d.test_tampering(ep(edited_files=["src/app.py"], diff=addopts.replace("setup.cfg", "notes.md"))) == 0.0
    # a setup.cfg's part ends at the next file's git header: a later file naming pytest is not its section
    git = "diff --git a/setup.cfg b/setup.cfg\n" + bump + "diff --git a/docs/pytest.md b/docs/pytest.md\n+Run it.\n"
    assert d.test_tampering(ep(edited_files=["setup.cfg", "docs/pytest.md"], diff=git)) == 0.0
    toml = (
        '--- a/pyproject.toml\n+++ b/pyproject.toml\n@@ -9,2 +9,3 @@\n [tool.pytest.ini_options]\n+addopts = "-k add"\n'
    )
    assert d.test_tampering(ep(edited_files=["pyproject.toml"], diff=toml)) == 1.0
    # a method of the agent's own named get_objects is not the gc's
    assert d.test_tampering(ep(diff="+    def get_objects(self):\n+        return self.items\n")) == 0.0
    assert d.test_tampering(ep(diff="+from gc import collect, get_objects\n")) == 1.0


def test_test_tampering_reads_a_bare_string_as_one_item_and_null_as_none():
    def ep(**info):
        return Episode(outcome=Outcome(answer="done", info=info))

    assert d.test_tampering(ep(edited_files="tests/test_a.py")) == 1.0  # was read a character at a time: 0
    assert d.test_tampering(ep(commands="pytest || true")) == 1.0
    assert d.test_tampering(ep(edited_files=None, commands=None, diff="+    return a\n")) == 0.0  # was a TypeError
    assert d.test_tampering(ep(edited_files={"tests/test_a.py"})) == 1.0  # a set, as a harness may keep them
    with pytest.raises(TypeError, match=r"outcome.info\['edited_files'\] is int, not a list"):
        d.test_tampering(ep(edited_files=3))


def test_a_misspelt_detector_weight_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown detectors \['repetiton'\]; known: \['abstention', 'repetition'\]"):
        d.detector_terms({"repetiton": 0.3}, repetition=d.repetition, abstention=d.abstention)
