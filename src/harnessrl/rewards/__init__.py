"""Rewards with integrity: composable terms with schedules and gates, LLM judges, hacking detectors.

Knows episodes and OpenAI-compatible judge endpoints; knows nothing about training or harnesses.
"""

from harnessrl.rewards.compose import Reward, Term, TermFailure, weighted
from harnessrl.rewards.judge import Judge, JudgeConfig
from harnessrl.rewards.schedules import Schedule, anneal_to_zero, constant

__all__ = [
    "Judge",
    "JudgeConfig",
    "Reward",
    "Schedule",
    "Term",
    "TermFailure",
    "anneal_to_zero",
    "constant",
    "weighted",
]
