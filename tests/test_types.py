import json
import math
from typing import Literal

import pytest
from pydantic import BaseModel, ValidationError

from harnessrl.types import Call, Episode, Outcome, RewardBreakdown, Task, first_error, read_yaml


def _episode() -> Episode:
    calls = [
        Call(prompt_ids=[1, 2, 3], completion_ids=[4, 5], sampled_logprobs=[-0.1, -1e-30], policy_version=3),
        Call(
            agent="searcher", prompt_ids=[1, 2, 3, 4, 5, 6], completion_ids=[7], sampled_logprobs=[-2.718281828459045],
            policy_version=4, trainable=False, finish_reason="tool_calls", extends_call=0, tool_call_error="bad JSON",
        ),
    ]  # fmt: skip
    return Episode(
        task=Task(id="t1", prompt="Où est Zoë? 🌍", data={"answer": "Paris", "hops": 2}, split="test"),
        calls=calls,
        outcome=Outcome(answer="Paris", success=True, info={"docs": ["d1"]}),
        reward=RewardBreakdown(total=0.7000000000000001, terms={"f_beta": 0.5, "bonus": 0.2}, weights={"f_beta": 0.7}),
        metrics={"turns": 2.0, "critical_steps": 1.5},
        status="failed",
        failure_reason="timeout after 30 s",
    )


def test_episode_round_trips_through_one_json_line_exactly():
    episode = _episode()
    line = episode.to_json()
    assert "\n" not in line
    again = Episode.from_json(line)
    assert again == episode
    assert again.calls[0].sampled_logprobs[1] == -1e-30  # floats bit-exact, not rounded
    assert again.to_json() == line


def test_nan_and_infinities_round_trip_as_standard_json():
    episode = _episode()
    episode.metrics = {"mean_of_nothing": math.nan, "ratio": math.inf}
    episode.calls[0].sampled_logprobs[0] = -math.inf  # a backend's logprob of a token outside its nucleus
    line = episode.to_json()
    assert json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))["metrics"]["ratio"]
    again = Episode.from_json(line)
    assert math.isnan(again.metrics["mean_of_nothing"]) and again.metrics["ratio"] == math.inf
    assert again.calls[0].sampled_logprobs[0] == -math.inf


def test_logprobs_must_align_with_completion_ids():
    with pytest.raises(ValidationError, match="sampled_logprobs has 1 entries but completion_ids has 2"):
        Call(prompt_ids=[1], completion_ids=[2, 3], sampled_logprobs=[-0.5], policy_version=0)


def test_a_typo_in_a_trace_line_names_the_field():
    line = _episode().to_json().replace('"outcome"', '"outcom"')
    with pytest.raises(ValidationError, match="outcom"):
        Episode.from_json(line)


def test_an_episode_succeeded_only_on_the_harness_verdict_true():
    assert Episode(outcome=Outcome(success=True)).succeeded
    assert not Episode().succeeded  # no outcome: the harness gave no verdict
    assert not Episode(outcome=Outcome(answer="Paris")).succeeded  # an answer without a verdict
    assert not Episode(outcome=Outcome(success=False)).succeeded


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda e: setattr(e.calls[1], "extends_call", 1), "calls.1.extends_call: 1 is not an earlier call"),
        (lambda e: setattr(e.calls[1], "parent_call", 3), "calls.1.parent_call: 3 is not an earlier call"),
        (lambda e: e.calls[1].prompt_ids.__setitem__(4, 9), "calls.1.extends_call: its prompt_ids do not begin"),
    ],
)
def test_a_call_links_only_to_an_earlier_call_whose_tokens_its_prompt_begins_with(change, named):
    episode = _episode()
    change(episode)  # assignments are not validated: the line read back is
    with pytest.raises(ValidationError, match=named) as refused:
        Episode.from_json(episode.to_json())
    assert first_error(refused.value, "line").startswith(named)  # no "line: Value error, " before it
    with pytest.raises(ValidationError, match="extends_call"):
        Call(prompt_ids=[1], completion_ids=[], sampled_logprobs=[], policy_version=0, extends_call=-1)


def test_a_yaml_key_given_twice_is_named_with_its_line_and_a_merge_key_may_be_overridden(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("rl:\n  updates: 3\nsft:\n  steps: 5\nrl:\n  updates: 4\n")
    with pytest.raises(ValueError, match=r"twice.yaml: line 5, column 1: not YAML: key 'rl' given twice"):
        read_yaml(twice)
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &b {lr: 1, steps: 2}\nrun:\n  <<: *b\n  lr: 3\n")
    assert read_yaml(merged)["run"] == {"lr": 3, "steps": 2}
    merged.write_text("a: 1\n=: 2\n")  # a value key, a plain string to safe_load
    assert read_yaml(merged) == {"a": 1, "=": 2}


def test_a_union_field_is_named_once_with_what_each_member_wanted():
    class Config(BaseModel):
        budget: float | Literal["auto"] | None = None

    with pytest.raises(ValidationError) as refused:
        Config.model_validate({"budget": "fast"})
    said = first_error(refused.value, "config", {"budget": "fast"})
    assert said.startswith("budget: ") and "valid number" in said and "'auto'" in said, said
    with pytest.raises(ValidationError) as refused:  # a key that is no identifier is a key, not a union's member
        Episode.model_validate({"metrics": {"error/malformed": "yes"}})
    for data in (None, {"metrics": {"error/malformed": "yes"}}):
        assert first_error(refused.value, "line", data).startswith("metrics.error/malformed: "), data


def test_a_jsonl_file_saved_with_a_byte_order_mark_reads_and_a_later_one_is_named(tmp_path):
    from harnessrl.types import TraceLineError, read_jsonl

    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (Task(id="a").model_dump_json() + "\n").encode() * 2)
    assert [t.id for t in read_jsonl(path, Task)] == ["a", "a"]
    path.write_bytes((Task(id="a").model_dump_json() + "\n").encode() + b"\xef\xbb\xbf{}\n")
    with pytest.raises(TraceLineError, match="line 2"):
        read_jsonl(path, Task)
