"""Micro-batches: training sequences packed into padded tensors, and the forward pass that scores them.

The G sequences of a group begin with the same prompt. Each sequence is cut where its loss begins:
the prefix (every token before the one whose logits score the first loss token) and the tail (the
rest). The forward runs each distinct prefix of the micro-batch once, then every tail against its
prefix's keys and values, so the transformer body sees P x prompt + P x G x completion tokens
instead of P x G x (prompt + completion), and the vocabulary projection and log-softmax run on the
tails' loss positions only. The loss positions get the same logits as a full forward (up to float
rounding), and the gradient reaches the prefix through its keys and values. Rows of distinct tasks
(SFT) share a shorter prefix instead, the head they all begin with (a system prompt and tool
schemas), when that saves more (`_shared_cuts`).

Per-token tensors are laid out along the tails: column t of row b scores tail token t + 1 (as
`losses.token_logprobs`). It knows sequences and tensors, and scores the loss positions with
`losses.row_logprobs`; nothing about episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from harnessrl.train import losses
from harnessrl.train.sequences import Sequence

SHARED_MIN = 0.25  # split off the prefixes only when that saves at least this share of the tokens


@dataclass
class MicroBatch:
    prefix_ids: torch.Tensor  # (P, S) distinct prefixes, right-padded; S = 0 when every prefix is empty
    prefix_of: torch.Tensor  # (B,) row of prefix_ids each sequence continues
    ids: torch.Tensor  # (B, T) tails, right-padded
    attention: torch.Tensor  # (B, S + T) 1 on the row's own prefix and tail tokens
    positions: torch.Tensor  # (B, T) position ids of the tail tokens
    mask: torch.Tensor  # (B, T-1) 1 on loss tokens
    behaviour: torch.Tensor  # (B, T-1) sampled logprobs
    versions: torch.Tensor  # (B, T-1) policy_version that sampled the token; -1 elsewhere
    advantages: torch.Tensor  # (B, 1)
    weights: torch.Tensor  # (B, 1) each sequence's loss weight (Sequence.weight)
    temperature: torch.Tensor  # (B, T-1) the temperature each token was sampled at
    top_p: torch.Tensor  # (B, T-1) the nucleus each token was sampled from
    sampled: torch.Tensor  # (B, T-1) 1 where the token is a random draw (an importance ratio may use it)
    names: torch.Tensor  # (B, T-1) 1 where the token writes a called tool's name (Sequence.names)

    @property
    def padded_tokens(self) -> int:
        """Tokens the transformer body runs on, padding included."""
        return self.prefix_ids.numel() + self.ids.numel()


def micro_batches(sequences: list[Sequence], budget: int, loss_budget: int | None = None) -> list[list[Sequence]]:
    """Longest first, packed while (rows x longest row) stays within the token budget and the loss
    tokens (the rows `tail_logprobs` projects onto the vocabulary) within `loss_budget`."""
    batches: list[list[Sequence]] = []
    loss = 0  # loss tokens of the last micro-batch
    for seq in sorted(sequences, key=len, reverse=True):
        fits = batches and (len(batches[-1]) + 1) * len(batches[-1][0]) <= budget
        if fits and (loss_budget is None or loss + seq.loss_tokens <= loss_budget):
            batches[-1].append(seq)
            loss += seq.loss_tokens
        else:
            batches.append([seq])
            loss = seq.loss_tokens
    return batches


def micro_batch(batch: list[Sequence]) -> MicroBatch:
    """The tensors of one micro-batch, each distinct prefix once."""
    cuts = _shared_cuts(batch)
    heads = [tuple(s.ids[:cut]) for s, cut in zip(batch, cuts)]
    rows: dict[tuple[int, ...], int] = {}
    prefix_of = [rows.setdefault(head, len(rows)) for head in heads]
    prefixes = list(rows)
    width = max(map(len, prefixes))
    tails = [s.ids[cut:] for s, cut in zip(batch, cuts)]
    length = max(map(len, tails))

    def pad(rows, value, size):
        return [row + [value] * (size - len(row)) for row in rows]

    attention = [
        [1] * cut + [0] * (width - cut) + [1] * len(tail) + [0] * (length - len(tail)) for cut, tail in zip(cuts, tails)
    ]
    return MicroBatch(
        prefix_ids=torch.tensor(pad([list(p) for p in prefixes], 0, width), dtype=torch.long).reshape(
            len(prefixes), width
        ),
        prefix_of=torch.tensor(prefix_of),
        ids=torch.tensor(pad(tails, 0, length)),
        attention=torch.tensor(attention),
        positions=torch.tensor([list(range(cut, cut + length)) for cut in cuts]),
        mask=torch.tensor(pad([s.loss_mask[cut + 1 :] for s, cut in zip(batch, cuts)], 0, length - 1)).float(),
        behaviour=torch.tensor(pad([s.sampled_logprobs[cut + 1 :] for s, cut in zip(batch, cuts)], 0.0, length - 1)),
        versions=torch.tensor(pad([s.versions[cut + 1 :] for s, cut in zip(batch, cuts)], -1, length - 1)),
        advantages=torch.tensor([[s.advantage] for s in batch], dtype=torch.float32),
        weights=torch.tensor([[s.weight] for s in batch], dtype=torch.float32),
        temperature=torch.tensor(pad([s.temperatures[cut + 1 :] for s, cut in zip(batch, cuts)], 1.0, length - 1)),
        top_p=torch.tensor(pad([s.top_ps[cut + 1 :] for s, cut in zip(batch, cuts)], 1.0, length - 1)),
        sampled=torch.tensor(pad([s.sampled[cut + 1 :] for s, cut in zip(batch, cuts)], 0, length - 1)).float(),
        names=torch.tensor(pad([s.names[cut + 1 :] for s, cut in zip(batch, cuts)], 0, length - 1)).float(),
    )


def tail_logits(model, mb: MicroBatch) -> torch.Tensor:
    """(B, T, V) fp32 logits of every tail position: the reference the tests and
    benchmarks/loss_positions.py hold `tail_logprobs` (which projects only the loss positions) to."""
    hidden = _tail_hidden(model, mb)
    with torch.autocast(hidden.device.type, enabled=False):
        return model.get_output_embeddings()(hidden.float())


def tail_logprobs(
    model, mb: MicroBatch, sampled: bool = False, with_entropy_grad: bool = False, vocab: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), each (B, T - 1) as `losses.token_logprobs` lays them out, 0 off the loss mask.

    Only the positions that score a loss token go through the vocabulary projection and the
    log-softmax: in agent episodes most tail tokens are tool results and prompts (the search job's
    SFT: 11 % loss tokens). `sampled` scores the distribution each token was sampled from
    (`mb.temperature`, `mb.top_p`, and no id from `vocab` on, as the sampler); otherwise the model's own
    softmax. The transformer body runs under whatever autocast the caller set; the projection and the
    softmax in fp32 outside it, so bf16 training perturbs the logprobs only through the body's hidden
    states (the sampler runs the whole model in fp32).
    """
    hidden = _tail_hidden(model, mb)
    where = mb.mask > 0  # (B, T - 1): position t scores tail token t + 1
    sampling = {"temperature": mb.temperature[where], "top_p": mb.top_p[where], "vocab": vocab} if sampled else {}
    with torch.autocast(hidden.device.type, enabled=False):
        logits = model.get_output_embeddings()(hidden[:, :-1][where].float())  # (N, V)
        logp, entropy = losses.row_logprobs(
            logits, mb.ids[:, 1:][where], **sampling, with_entropy_grad=with_entropy_grad
        )

    def spread(values: torch.Tensor) -> torch.Tensor:
        out = values.new_zeros(where.shape)
        out[where] = values
        return out

    return spread(logp), spread(entropy)


def _tail_hidden(model, mb: MicroBatch) -> torch.Tensor:
    """(B, T, H) last hidden states of the tails; each prefix runs once, shared through its keys and values."""
    body = model.get_decoder()
    cache = None
    if mb.prefix_ids.shape[1]:
        # causal, no mask: a prefix's right padding comes after its tokens and is masked in the tails
        prefix = DynamicCache()
        body(input_ids=mb.prefix_ids, cache=prefix, use_cache=True)
        if prefix.get_seq_length() != mb.prefix_ids.shape[1]:  # never score tails without their prompt
            raise RuntimeError(
                "the model did not fill the prompt's KV cache (a transformers without the `cache` argument, or caching disabled)"
            )
        cache = DynamicCache(
            ddp_cache_data=[(layer.keys[mb.prefix_of], layer.values[mb.prefix_of]) for layer in prefix.layers]
        )
    return body(input_ids=mb.ids, attention_mask=mb.attention, position_ids=mb.positions, cache=cache).last_hidden_state


def _shared_cuts(batch: list[Sequence]) -> list[int]:
    """Where each row's tail begins. Either after its whole prompt (a group's G samples share it) or
    after the prefix every row shares (a system prompt and tool schemas: SFT on distinct tasks),
    whichever saves more tokens; 0 everywhere (one plain forward) when neither saves SHARED_MIN."""
    prompts = [prompt_length(s) for s in batch]
    by_prompt = sum(prompts) - sum(map(len, {tuple(s.ids[:cut]) for s, cut in zip(batch, prompts)}))
    common = min(prompts)
    for s in batch[1:]:
        common = next((i for i in range(common) if s.ids[i] != batch[0].ids[i]), common)
    by_common = (len(batch) - 1) * common
    if max(by_prompt, by_common) < SHARED_MIN * sum(map(len, batch)):
        return [0] * len(batch)
    return prompts if by_prompt >= by_common else [common] * len(batch)


def prompt_length(seq: Sequence) -> int:
    """Where the tail begins: the position whose logits score the first loss token (token 0 is never scored)."""
    first = next((i for i in range(1, len(seq)) if seq.loss_mask[i]), 1)
    return first - 1
