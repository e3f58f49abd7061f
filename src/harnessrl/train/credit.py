"""Who gets which advantage: every sequence of an episode the episode's (the default), or each agent role its own.

`episode` credit: one group per task, one advantage per episode, shared by all its trainable
sequences (frozen sub-agents carry no loss anyway). `role` credit, for swarms whose sub-agents are
trainable too: within one task's group, the sequences of each role (the agent of a lineage's
calls) form their own group whose members are that role's lineages across the G episodes, each
scored with its episode's reward; a role seen in only one episode has nothing to compare with (its
members share one reward) and is dropped (counted), never trained on with a made-up baseline. The orchestrator ("main") group is the
episode group, G members.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from harnessrl.train.advantages import AdvantageKind, group_advantages
from harnessrl.train.sequences import Sequence, episode_sequences
from harnessrl.types import Episode

Credit = Literal["episode", "role"]


def role_groups(
    group: list[Episode], scores: list[float], mask_agents: Collection[str] = (), share: bool = False
) -> dict[str, list[tuple[list[Sequence], float]]]:
    """role -> its members: (the sequences of one lineage of one episode, that episode's reward)."""
    members: dict[str, dict[tuple[str, str], tuple[list[Sequence], float]]] = {}
    for episode, score in zip(group, scores):
        for seq in episode_sequences(episode, 0.0, mask_agents, share):
            role = episode.calls[seq.calls[0]].agent
            members.setdefault(role, {}).setdefault((episode.id, seq.lineage), ([], score))[0].append(seq)
    return {role: list(by_member.values()) for role, by_member in members.items()}


def credited_sequences(
    group: list[Episode],
    scores: list[float],
    kind: AdvantageKind,
    credit: Credit = "episode",
    mask_agents: Collection[str] = (),
    share: bool = False,
) -> tuple[list[Sequence], int]:
    """The group's training sequences with their advantages, and how many role groups came from one episode.

    `mask_agents` and `share` go to `episode_sequences` (masked agents, segments sharing one weight)."""
    if credit == "episode":
        advantages = group_advantages(scores, kind)
        return [s for e, adv in zip(group, advantages) for s in episode_sequences(e, adv, mask_agents, share)], 0
    out, dropped = [], 0
    for members in role_groups(group, scores, mask_agents, share).values():
        if len({seqs[0].episode_id for seqs, _ in members}) < 2:
            dropped += 1
            continue
        for (sequences, _), adv in zip(members, group_advantages([score for _, score in members], kind)):
            for seq in sequences:
                seq.advantage = adv
                out.append(seq)
    return out, dropped
