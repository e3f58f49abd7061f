import json
import random

from harnessrl.eval.trend import training_trend


def _metrics(tmp_path, rows):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"rollout/groups": 4, **r}) + "\n" for r in rows))
    return path


def test_a_reward_that_falls_beyond_its_noise_trips_an_alarm_and_noise_does_not(tmp_path):
    rng = random.Random(0)
    noisy = [{"reward/mean": 0.7 + rng.uniform(-0.4, 0.4), "rollout/malformed_share": 0.2} for _ in range(24)]
    flat = training_trend(_metrics(tmp_path, noisy))
    assert flat["alarms"] == [] and flat["window"] == 8 and flat["updates"] == 24
    assert flat["rollout/malformed_share"] == {"first": 0.2, "last": 0.2, "stderr": 0.0}

    falling = [{"reward/mean": 0.7 - 0.03 * i + rng.uniform(-0.1, 0.1), "rollout/malformed_share": 0.2 + 0.02 * i}
               for i in range(24)]  # fmt: skip
    trend = training_trend(_metrics(tmp_path, falling))
    assert trend["alarms"] == ["reward_falling", "malformed_rising"]
    assert trend["reward/mean"]["first"] > trend["reward/mean"]["last"] + 2 * trend["reward/mean"]["stderr"]

    # a skipped update (every group tied) lacks the policy metrics: it still counts, and is not a zero
    skipped = [{"policy/entropy": 0.1}] * 5 + [{}] + [{"policy/entropy": 0.1}] * 6
    trend = training_trend(_metrics(tmp_path, skipped))
    assert trend["window"] == 4 and trend["policy/entropy"]["first"] == 0.1 and trend["alarms"] == []
    assert training_trend(tmp_path / "absent.jsonl") == {"updates": 0, "window": 0, "alarms": []}
