import json
import random

import pytest

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
    assert flat["rollout/malformed_share"] == {"first": 0.2, "last": 0.2, "stderr": 0.0, "p": 1.0}

    falling = [{"reward/mean": 0.7 - 0.03 * i + rng.uniform(-0.1, 0.1), "rollout/malformed_share": 0.2 + 0.02 * i}
               for i in range(24)]  # fmt: skip
    trend = training_trend(_metrics(tmp_path, falling))
    assert trend["alarms"] == ["reward_falling", "malformed_rising"]
    assert trend["reward/mean"]["first"] > trend["reward/mean"]["last"] and trend["reward/mean"]["p"] < 0.025

    # a skipped update (every group tied) lacks the policy metrics: it still counts, and is not a zero
    skipped = [{"policy/entropy": 0.1}] * 5 + [{}] + [{"policy/entropy": 0.1}] * 6
    trend = training_trend(_metrics(tmp_path, skipped))
    assert trend["window"] == 4 and trend["policy/entropy"]["first"] == 0.1 and trend["alarms"] == []
    assert training_trend(tmp_path / "absent.jsonl") == {"updates": 0, "window": 0, "alarms": []}


def test_a_flat_run_alarms_about_as_often_as_the_test_allows_short_ones_never(tmp_path):
    """A policy that never changes (each batch 16 episodes at success 0.5): the 2-standard-error rule alarmed in
    about one short run of five (a window of 2 updates that tied had a standard error of 0)."""
    rng = random.Random(1)

    def alarmed(updates: int) -> bool:
        rows = [{"rollout/success": sum(rng.random() < 0.5 for _ in range(16)) / 16} for _ in range(updates)]
        return bool(training_trend(_metrics(tmp_path, rows))["alarms"])

    assert not any(alarmed(6) or alarmed(9) for _ in range(100))  # 2-3 values a window: cannot tell, never alarms
    assert sum(alarmed(24) for _ in range(200)) <= 12  # one-sided 2.5 %: 5 expected of 200
    tied = [{"rollout/success": v} for v in (0.5, 0.5, 0.3, 0.6, 0.4375, 0.4375)]  # one episode fewer of 16
    assert training_trend(_metrics(tmp_path, tied))["alarms"] == []


def test_a_value_that_is_not_finite_is_left_out_not_an_alarm_silenced(tmp_path):
    rows = [{"reward/mean": 0.9 - 0.04 * i} for i in range(24)]
    rows[20]["reward/mean"] = float("nan")
    trend = training_trend(_metrics(tmp_path, rows))
    assert trend["alarms"] == ["reward_falling"] and trend["reward/mean"]["last"] == pytest.approx(0.1229, abs=1e-3)
