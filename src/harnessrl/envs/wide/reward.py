"""Item-level F1 (WideSearch's item-F1): the orchestrator's answers against the gold ones, item by item,
plus the PARL terms (rewards/parl.py) with their annealed weights and a malformed-call penalty."""

from __future__ import annotations

from harnessrl.envs.search.data import answers_match
from harnessrl.rewards import Reward, Schedule, Term
from harnessrl.rewards.parl import parl_reward
from harnessrl.types import Episode


def item_f1(episode: Episode) -> float:
    """2PR / (P + R), items matched by key, as WideSearch matches rows: the question's number ("1",
    "2", ...; a list is keyed by position). Precision over the items answered (non-empty; a key that
    names no question is a wrong answer), recall over all items."""
    gold = {str(i + 1): g for i, g in enumerate(episode.task.data.get("answers", []))}
    given = (episode.outcome.info.get("answers") if episode.outcome else None) or {}
    if isinstance(given, list):
        given = {str(i + 1): a for i, a in enumerate(given)}
    answered = {k: a for k, a in given.items() if isinstance(a, str) and a.strip()}
    correct = sum(k in gold and answers_match(a, gold[k]) for k, a in answered.items())
    if not correct:
        return 0.0
    precision, recall = correct / len(answered), correct / len(gold)
    return 2 * precision * recall / (precision + recall)


def malformed_orchestrator_calls(episode: Episode) -> float:
    """Share of the trainable calls whose tool-call text did not parse (a frozen sub-agent's are not the policy's)."""
    own = [c for c in episode.calls if c.trainable]
    return sum(c.tool_call_error is not None for c in own) / len(own) if own else 0.0


def wide_reward(
    lambda_parallel: Schedule | None = None, lambda_finish: Schedule | None = None, malformed_weight: float = 0.5
) -> Reward:
    """item_f1 + the PARL terms - malformed_weight x the share of the orchestrator's calls that did not
    parse: a broken call must cost something, or RL cannot tell it from a well-formed miss."""
    reward = parl_reward(Term("item_f1", item_f1), lambda_parallel, lambda_finish)
    reward.terms.append(Term("malformed_tool_calls", malformed_orchestrator_calls, -abs(malformed_weight), flag=True))
    return reward
