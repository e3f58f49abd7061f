"""From an episode's recorded calls to training sequences with loss masks.

A call whose prompt begins with an open sequence's ids (the previous turn's prompt + completion,
as the gateway records it) is merged into that sequence: the new prompt tokens (tool results, user
turns, template glue) are appended with mask 0 and the completion with mask 1. A call that extends
nothing (after a prune or a summary) starts a new sequence. Only sampled tokens of trainable calls
carry loss: never prompt, tool or user tokens, never a frozen sub-agent's completion. Sequences with
no loss token are dropped. A call extends only sequences of its own lineage (`harnessrl.calltree`), so a
sub-agent's turns never break into the orchestrator's chain. Each token also carries how it was drawn (temperature, top_p, and whether
it was a sample at all), so the trainer scores the distribution that sampled it and never takes an
importance ratio against a greedy token or a demonstration.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from harnessrl.calltree import lineage_of
from harnessrl.types import Episode


@dataclass
class Sequence:
    ids: list[int]
    loss_mask: list[int]  # 1 where the token was sampled by a trainable call
    sampled_logprobs: list[float]  # behaviour logprob of each sampled token; 0.0 elsewhere
    versions: list[int]  # policy_version that sampled each token; -1 where not sampled
    temperatures: list[float] = field(default_factory=list)  # the call's sampling temperature; 1.0 elsewhere
    top_ps: list[float] = field(default_factory=list)  # the call's nucleus; 1.0 elsewhere
    sampled: list[int] = field(default_factory=list)  # 1 where the token is a random draw (not greedy, not a demo)
    advantage: float = 0.0
    episode_id: str = ""
    calls: list[int] = field(default_factory=list)  # indices of the calls merged here
    lineage: str = ""  # the conversation its calls belong to
    weight: float = 1.0  # multiplies its tokens' loss: 1 / segments when a chain's segments share the advantage
    names: list[int] = field(default_factory=list)  # 1 on completion tokens that write a called tool's name (if asked)

    def __post_init__(self) -> None:  # built by hand without sampling details: samples at T = 1, no nucleus
        self.temperatures = self.temperatures or [1.0] * len(self.ids)
        self.top_ps = self.top_ps or [1.0] * len(self.ids)
        self.sampled = self.sampled or [1] * len(self.ids)
        self.names = self.names or [0] * len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def loss_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def sampled_loss_tokens(self) -> int:
        """Loss tokens an importance ratio may use (policy-gradient losses train on these only)."""
        return sum(m and s for m, s in zip(self.loss_mask, self.sampled))


def episode_sequences(
    episode: Episode,
    advantage: float = 0.0,
    mask_agents: Collection[str] = (),
    share: bool = False,
    names: Callable[[list[int]], list[int]] | None = None,
) -> list[Sequence]:
    """The training sequences of one episode, each carrying the episode's advantage.

    Completions of calls whose agent is in `mask_agents` carry no loss (e.g. "summariser": the
    ablation of trained self-summaries). `share`: the episode's sequences (the segments of a chain
    cut by summaries or prunes) weigh 1 / their number each, so the episode weighs 1 in all.
    `names(completion_ids)` (`toolformat.name_tokens`) fills `Sequence.names`."""
    sequences: list[Sequence] = []
    for index, call in enumerate(episode.calls):
        lineage = lineage_of(call)
        seq = _extended([s for s in sequences if s.lineage == lineage], call.prompt_ids)
        if seq is None:
            seq = Sequence([], [], [], [], advantage=advantage, episode_id=episode.id, lineage=lineage)
            sequences.append(seq)
        new_prompt = call.prompt_ids[len(seq.ids) :]
        seq.ids += new_prompt + call.completion_ids
        trained = call.trainable and call.agent not in mask_agents
        seq.loss_mask += [0] * len(new_prompt) + [int(trained)] * len(call.completion_ids)
        seq.sampled_logprobs += [0.0] * len(new_prompt) + list(call.sampled_logprobs)
        seq.versions += [-1] * len(new_prompt) + [call.policy_version] * len(call.completion_ids)
        seq.temperatures += [1.0] * len(new_prompt) + [call.temperature] * len(call.completion_ids)
        seq.top_ps += [1.0] * len(new_prompt) + [call.top_p] * len(call.completion_ids)
        seq.sampled += [0] * len(new_prompt) + [int(call.sampled)] * len(call.completion_ids)
        seq.names += [0] * len(new_prompt) + (names(call.completion_ids) if names else [0] * len(call.completion_ids))
        seq.calls.append(index)
    kept = [s for s in sequences if s.loss_tokens]
    for seq in kept if share else ():
        seq.weight = 1.0 / len(kept)
    return kept


def _extended(sequences: list[Sequence], prompt: list[int]) -> Sequence | None:
    """The longest open sequence whose ids begin `prompt`; the latest one on a tie."""
    best = None
    for seq in sequences:
        if len(seq.ids) <= len(prompt) and prompt[: len(seq.ids)] == seq.ids:
            if best is None or len(seq.ids) >= len(best.ids):
                best = seq
    return best
