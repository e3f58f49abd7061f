"""Reward from users' feedback: a versioned map from signals to reward, with the hacks priced in.

An episode's reward is the mean of its calls' signal rewards, plus two penalties that apply whatever
the user said (Cursor's first real-time runs found both hacks): each malformed tool call (a call the
gateway could not parse: it is never filtered out, or breaking calls would dodge negative reward)
and a final answer that is a clarifying question instead of an answer (deferring the risky work).
An episode with no signal is *unlabelled* unless a penalty applies: it is counted, never trained on
and never silently dropped.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.loop.store import StoredEpisode
from harnessrl.rewards.detectors import clarifying_question, malformed_tool_calls
from harnessrl.types import RewardBreakdown


class FeedbackMap(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(default="feedback-v1", description="recorded with every reward it produced; bump on change")
    accepted: float = Field(default=1.0, description="the user kept the response")
    edited: float = Field(default=0.5, description="the user kept it after editing it")
    rejected: float = Field(default=-1.0, description="the user discarded it")
    dissatisfied: float = Field(default=-0.5, description="a dissatisfied follow-up (Cursor: a signal to minimise)")
    scalar_weight: float = Field(default=1.0, description="a `scalar` signal's value (-1..1) times this")
    malformed_tool_call: float = Field(default=-1.0, description="per episode, times the share of malformed calls")
    clarifying_question: float = Field(default=-0.5, description="when the final answer is a question back")

    def signal_reward(self, signal: str, value: float | None) -> float:
        return self.scalar_weight * (value or 0.0) if signal == "scalar" else getattr(self, signal)


def feedback_reward(stored: StoredEpisode, mapping: FeedbackMap) -> RewardBreakdown | None:
    """The episode's reward from its feedback and penalties; None when it is unlabelled."""
    episode = stored.episode
    malformed, deferral = malformed_tool_calls(episode), clarifying_question(episode)
    if not stored.feedback and not malformed and not deferral:
        return None
    terms: dict[str, float] = {}
    if stored.feedback:
        rewards = [mapping.signal_reward(f.signal, f.value) for f in stored.feedback]
        terms["feedback"] = sum(rewards) / len(rewards)
    terms["malformed_tool_call"] = mapping.malformed_tool_call * malformed
    terms["clarifying_question"] = mapping.clarifying_question * deferral
    flags = [name for name, hit in (("malformed_tool_call", malformed), ("clarifying_question", deferral)) if hit]
    weights = {
        "feedback": 1.0,
        "malformed_tool_call": mapping.malformed_tool_call,
        "clarifying_question": mapping.clarifying_question,
    }
    return RewardBreakdown(total=sum(terms.values()), terms=terms, weights=weights, flags=flags)
