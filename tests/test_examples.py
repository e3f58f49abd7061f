"""The examples a newcomer copies run as documented (at minimal size)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"
BENCHMARKS = EXAMPLES.parent / "benchmarks"


def test_the_unchanged_weather_agent_trains_with_rl():
    done = subprocess.run([sys.executable, str(EXAMPLES / "train_weather_agent.py"), "--updates", "2", "--groups", "1", "--group-size", "2"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["reward_by_update"]) == 2 and all(0.0 <= r <= 1.0 for r in result["reward_by_update"])


def test_the_weather_reward_checks_the_argument_the_tool_receives():
    sys.path.insert(0, str(EXAMPLES))
    try:
        from train_weather_agent import first_reply_arguments
    finally:
        sys.path.remove(str(EXAMPLES))
    from harnessrl.policy import Policy
    from harnessrl.types import Call, Episode, Task

    policy = Policy.load("tiny")
    try:
        arguments = first_reply_arguments(policy)

        def first_reply(text: str) -> Episode:
            ids = policy.encode(text)
            call = Call(prompt_ids=[1], completion_ids=ids, sampled_logprobs=[0.0] * len(ids), policy_version=0)
            return Episode(task=Task(prompt="What is the weather in Accra?", data={"city": "Accra"}), calls=[call])

        call = '<tool_call>{"name": "get_weather", "arguments": {%s}}</tool_call>'
        assert arguments(first_reply(call % '"city": "Accra"')) == [{"city": "Accra"}]
        # the city's name under another key (what RL found when the reward matched text) is no city
        assert arguments(first_reply(call % '"could": "Accra"')) == [{"could": "Accra"}]
        assert arguments(first_reply(call % '"city": "Accra"}')) == []  # malformed: the tool is never called
        assert arguments(Episode()) == []
    finally:
        policy.close()


@pytest.mark.parametrize(
    "script, args, refusal",
    [
        ("shared_prefix.py", ["--rounds", "0"], "argument --rounds: at least 1, got 0"),  # was: the median of nothing
        # --config absent: before, the swarm job ran first and --widths was read after it
        ("swarm.py", ["--widths", "12,x", "--config", "absent.yaml"], "argument --widths: a whole number, got 'x'"),
        ("context_pruning.py", ["--corpus", "corpus.jsonl"], "--corpus and --tasks-file go together"),
    ],
)
def test_a_benchmark_refuses_bad_arguments_before_it_runs(script, args, refusal, tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2 and refusal in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_the_loss_positions_benchmark_runs_against_the_trainer():
    """It swaps the trainer's `tail_logprobs` for its baseline: a new trainer argument broke it unseen."""
    args = [
        "--rounds",
        "1",
        "--episodes",
        "4",
        "--turns",
        "1",
        "--prompt",
        "8",
        "--completion",
        "4",
        "--observation",
        "0",
    ]
    done = subprocess.run([sys.executable, str(BENCHMARKS / "loss_positions.py"), *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert {"sft_speedup", "rl_speedup", "loss_share"} <= json.loads(done.stdout.strip().splitlines()[-1]).keys()


def test_the_production_example_empties_only_its_own_run_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    done = subprocess.run([sys.executable, str(EXAMPLES / "production" / "run_loop.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2 and "holds something other than this example's run" in done.stderr, done.stderr[-3000:]
    assert (tmp_path / "notes.txt").read_text() == "mine"
