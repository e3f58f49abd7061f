"""Group-relative advantages: one scalar per episode from the rewards of its group (same task)."""

from __future__ import annotations

from typing import Literal

import torch

AdvantageKind = Literal["grpo", "drgrpo", "rloo"]


def group_advantages(rewards: list[float], kind: AdvantageKind = "grpo", eps: float = 1e-6) -> list[float]:
    """Advantages of one group of G rewards.

    grpo    (Shao et al. 2024, DeepSeekMath): (r - mean) / (std + eps), std over the group
            (population std, i.e. divided by G).
    drgrpo  (Liu et al. 2025, "Understanding R1-Zero-like training"): r - mean; no std division,
            which biases the update toward groups with low reward variance.
    rloo    (Ahmadian et al. 2024): r_i - mean of the other G - 1 rewards = G / (G - 1) (r_i - mean).
    """
    r = torch.tensor(rewards, dtype=torch.float64)
    if len(r) < 2:
        raise ValueError(f"a group needs at least 2 episodes to compare, got {len(r)}")
    centred = r - r.mean()
    if kind == "grpo":
        out = centred / (r.std(unbiased=False) + eps)
    elif kind == "drgrpo":
        out = centred
    elif kind == "rloo":
        out = centred * len(r) / (len(r) - 1)
    else:
        raise ValueError(f"unknown advantage kind {kind!r}")
    return out.tolist()


def is_degenerate(rewards: list[float], tol: float = 1e-9) -> bool:
    """True when every reward is equal: the group has no signal (DAPO's dynamic sampling drops it)."""
    return max(rewards) - min(rewards) <= tol
