"""Item-level F1 (WideSearch's item-F1): the orchestrator's answers against the gold ones, item by item,
plus the PARL terms (rewards/parl.py) with their annealed weights."""

from __future__ import annotations

from harnessrl.envs.search.data import answers_match
from harnessrl.rewards import Reward, Schedule, Term
from harnessrl.rewards.parl import parl_reward
from harnessrl.types import Episode


def item_f1(episode: Episode) -> float:
    """2PR / (P + R): precision over the items answered (non-empty), recall over all items."""
    gold = episode.task.data.get("answers", [])
    given = (episode.outcome.info.get("answers") if episode.outcome else None) or []
    answered = [(g, a) for g, a in zip(gold, given) if isinstance(a, str) and a.strip()]
    correct = sum(answers_match(a, g) for g, a in answered)
    if not correct:
        return 0.0
    precision, recall = correct / len(answered), correct / len(gold)
    return 2 * precision * recall / (precision + recall)


def wide_reward(lambda_parallel: Schedule | None = None, lambda_finish: Schedule | None = None) -> Reward:
    return parl_reward(Term("item_f1", item_f1), lambda_parallel, lambda_finish)
