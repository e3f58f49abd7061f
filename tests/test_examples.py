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
