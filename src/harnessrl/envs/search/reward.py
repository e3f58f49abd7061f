"""The search environment's reward, after Chroma's Context-1:

    clamp(0.7 F_beta(returned vs gold docs) + 0.3 trajectory recall + answer bonus
          - prune-streak penalty - turn penalty - hacking detectors, -1, 2)

(`context1_reward`'s default weights). The search job's `reward:` block (`SearchReward`) keeps every
term but defaults to the outcome: the answer bonus, the malformed-call and repetition detectors and
the prune-streak penalty, with F_beta, trajectory recall, the turn cost and answer stuffing at 0. Its
held-out episodes showed why (docs/search-history.md, "What the reward pays for failing"): where a multi-hop chain
rarely succeeds, an early wrong answer citing the one gold document it found scores 0.52 against
0.20 for a longer search, so GRPO learnt to answer after the first search; from the same warm starts
the outcome alone gained +0.14 and +0.15 held-out where Context-1's weights gained -0.01 and +0.01.

The answer bonus (1.0) weighs a correct answer as much as perfect retrieval: with a smaller bonus
(0.3) RL on the tiny model learnt to cite the right documents and stopped answering correctly.

beta is annealed from 4 (recall matters most while the agent learns to find things) to 2; every
term is logged in the breakdown, at weight 0 too. The detectors that apply here: malformed tool calls,
answer stuffing (a precision floor on returned documents), degenerate repetition, and turn farming
(the turn penalty is Composer 2's concave effort cost).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.rewards import Reward, Schedule, Term
from harnessrl.rewards import detectors as d
from harnessrl.types import Episode


def f_beta(returned: set[str], gold: set[str], beta: float) -> float:
    """(1 + b^2) P R / (b^2 P + R); 0 when nothing relevant was returned."""
    hit = len(returned & gold)
    if not hit:
        return 0.0
    precision, recall = hit / len(returned), hit / len(gold)
    return (1 + beta**2) * precision * recall / (beta**2 * precision + recall)


def _docs(e: Episode, key: str) -> set[str]:
    return set((e.outcome.info.get(key) if e.outcome else None) or [])


def context1_reward(
    anneal_steps: int = 200,
    answer_bonus: float = 1.0,
    prune_streak_penalty: float = 0.05,
    turn_weight: float = 0.05,
    f_beta_weight: float = 0.7,
    recall_weight: float = 0.3,
    detector_weights: dict[str, float] | None = None,
) -> Reward:
    beta = Schedule(kind="linear", start=4.0, end=2.0, steps=anneal_steps)
    gold = lambda e: set(e.task.data.get("gold_doc_ids", []))  # noqa: E731

    def f_beta_term(e: Episode, step: int) -> float:
        return f_beta(_docs(e, "doc_ids"), gold(e), beta.value(step))

    def trajectory_recall(e: Episode) -> float:
        return len(_docs(e, "trajectory_doc_ids") & gold(e)) / max(1, len(gold(e)))

    def answered(e: Episode) -> float:
        return float(e.succeeded)

    def prune_streak(e: Episode) -> float:
        return max(0, (e.outcome.info.get("max_prune_streak", 0) if e.outcome else 0) - 1)

    return Reward(
        [
            Term("f_beta", f_beta_term, f_beta_weight, with_step=True),
            Term("trajectory_recall", trajectory_recall, recall_weight),
            Term("answer_bonus", answered, answer_bonus),
            Term("prune_streak", prune_streak, -prune_streak_penalty),
            Term("turns", d.effort_penalty("turns", k=1.0, q=0.5, free=2), -turn_weight, flag=False),
            *d.detector_terms(
                detector_weights or {"malformed_tool_calls": 0.5, "answer_stuffing": 0.3, "repetition": 0.3},
                malformed_tool_calls=d.malformed_tool_calls,
                answer_stuffing=d.answer_stuffing(),
                repetition=d.repetition,
            ),
        ],
        clamp=(-1.0, 2.0),
    )


class SearchReward(BaseModel):
    """The job config's `reward:` block: the weights of `context1_reward`, the outcome's by default
    (Context-1's own: `f_beta: 0.7, trajectory_recall: 0.3, turns: 0.05, answer_stuffing: 0.3`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    f_beta: float = Field(default=0.0, description="weight of F_beta of the cited documents against the gold ones")
    trajectory_recall: float = Field(default=0.0, description="weight of the share of gold documents the agent saw")
    answer_bonus: float = Field(default=1.0, description="added for a correct answer")
    prune_streak: float = Field(default=0.05, ge=0, description="penalty per prune call beyond one in a row")
    turns: float = Field(default=0.0, ge=0, description="weight of the concave turn penalty (two turns free)")
    anneal_steps: int = Field(default=200, ge=1, description="updates over which beta goes from 4 to 2")
    malformed_tool_calls: float = Field(
        default=0.5, ge=0, description="penalty x the share of calls that did not parse"
    )
    answer_stuffing: float = Field(
        default=0.0, ge=0, description="penalty when the cited documents' precision is under the floor (F_beta's guard)"
    )
    repetition: float = Field(default=0.3, ge=0, description="penalty for degenerate repetition in a reply")

    def build(self) -> Reward:
        return context1_reward(
            anneal_steps=self.anneal_steps,
            answer_bonus=self.answer_bonus,
            prune_streak_penalty=self.prune_streak,
            turn_weight=self.turns,
            f_beta_weight=self.f_beta,
            recall_weight=self.trajectory_recall,
            detector_weights={
                "malformed_tool_calls": self.malformed_tool_calls,
                "answer_stuffing": self.answer_stuffing,
                "repetition": self.repetition,
            },
        )


class DemoFilter(BaseModel):
    """Context-1's SFT filter: keep trajectories that found enough and returned enough of the gold
    documents, plus a capped share of zero-recall ones as negatives."""

    model_config = ConfigDict(extra="forbid")
    trajectory_recall: float = Field(default=0.5, ge=0, le=1, description="keep when above: gold docs seen")
    output_recall: float = Field(default=0.4, ge=0, le=1, description="keep when above: gold docs returned")
    negatives: float = Field(default=0.05, ge=0, le=1, description="zero-recall episodes kept, as a share of the kept")


def recalls(e: Episode) -> tuple[float, float]:
    """(trajectory recall, output recall) against the task's gold documents."""
    gold = set(e.task.data.get("gold_doc_ids", []))
    seen, returned = _docs(e, "trajectory_doc_ids"), _docs(e, "doc_ids")
    return len(seen & gold) / max(1, len(gold)), len(returned & gold) / max(1, len(gold))


def filter_demonstrations(episodes: list[Episode], rule: DemoFilter) -> tuple[list[Episode], dict[str, int]]:
    """The kept episodes (positives in order, then negatives) and how many passed each threshold."""
    scored = [(e, *recalls(e)) for e in episodes]
    seen_ok = [x for x in scored if x[1] > rule.trajectory_recall]
    positives = [e for e, _, output in seen_ok if output > rule.output_recall]
    zero = [e for e, trajectory, output in scored if trajectory == 0 and output == 0]
    negatives = zero[: int(rule.negatives * len(positives))]
    counts = {
        "episodes": len(episodes),
        "above_trajectory_recall": len(seen_ok),
        "above_both": len(positives),
        "zero_recall": len(zero),
        "negatives_kept": len(negatives),
        "kept": len(positives) + len(negatives),
    }
    return positives + negatives, counts
