"""The examples a newcomer copies run as documented (at minimal size)."""

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


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
