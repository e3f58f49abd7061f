import pytest

from harnessrl.train.advantages import group_advantages, is_degenerate


def test_advantages_by_hand():
    rewards = [1.0, 0.0, 0.0, 1.0]  # mean 0.5, population std 0.5
    assert group_advantages(rewards, "grpo") == pytest.approx([1, -1, -1, 1], abs=1e-5)
    assert group_advantages(rewards, "drgrpo") == pytest.approx([0.5, -0.5, -0.5, 0.5])
    # leave-one-out: 1 - mean(0, 0, 1) = 2/3; 0 - mean(1, 0, 1) = -2/3
    assert group_advantages(rewards, "rloo") == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert group_advantages([3.0, 1.0], "grpo") == pytest.approx([1, -1], abs=1e-5)


def test_equal_rewards_are_degenerate_and_a_single_episode_is_refused():
    assert is_degenerate([0.7, 0.7, 0.7]) and not is_degenerate([0.7, 0.7, 0.2])
    assert group_advantages([0.7, 0.7], "grpo") == [0.0, 0.0]
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages([1.0])
