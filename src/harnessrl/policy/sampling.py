"""Next-token sampling, and the sampling distribution itself, shared by the sampler and the trainer."""

from __future__ import annotations

import torch


def sampling_logprobs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    keep: torch.Tensor | None = None,
    vocab: int | None = None,
) -> torch.Tensor:
    """Log-probabilities (N, V) of the distribution a row samples from: softmax(logits / T) cut to its top-p nucleus.

    logits (N, V), any float dtype (computed in fp32); temperature and top_p (N,). The nucleus (Holtzman
    et al. 2020) is the smallest set of most likely tokens whose mass reaches top_p, renormalised; rows
    with top_p = 1 are not cut at all (a cumulative sum that rounds to 1 early must not drop tail
    tokens). Temperature 0 (greedy) is scored at T = 1, positive temperatures under 1e-6 at 1e-6.
    `keep` (N,) names one token per row that stays in the nucleus whatever its rank: the trainer passes
    the sampled token, so a token that later weights push out of the nucleus gets a small probability
    instead of -inf (on policy it is in the nucleus anyway, and the result is the sampler's exactly).
    `vocab`: the tokenizer's size; ids from there on (embedding rows no token maps to) get no probability.
    The mask is chosen without gradient.
    """
    logits = _within(logits, vocab)
    # dividing by a subnormal temperature overflows to inf (NaN logprobs); at 1e-6 the distribution is
    # already a point mass on the argmax unless two logits lie within ~1e-5 of each other
    scale = torch.where(temperature > 0, temperature.float().clamp_min(1e-6), torch.ones_like(temperature).float())
    logp = torch.log_softmax(logits.float() / scale[:, None], dim=-1)  # (N, V)
    cut = top_p < 1
    if not bool(cut.any()):
        return logp
    with torch.no_grad():
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # (N, V) mass ranked above each token
        drop_sorted = (mass_before >= top_p[:, None]) & cut[:, None]
        drop_sorted[:, 0] = False  # the top token always stays: at top_p 0 too (else every token out, NaN logprobs)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        if keep is not None:
            drop[torch.arange(len(keep)), keep] = False
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generators: list[torch.Generator | None],
    vocab: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return (ids (B,), logprobs (B,)).

    Row b samples from `sampling_logprobs` (temperature- and top-p-adjusted); the returned logprob is
    taken under that same distribution, so an importance ratio against it is exact. temperature 0 means
    greedy: the argmax, with logprob 0.0 (a point mass). Each row draws from its own generator when
    given one, so a seeded request samples the same tokens whatever else shares its batch. Ids from `vocab`
    on are never drawn (see `sampling_logprobs`).
    """
    logits = _within(logits.float(), vocab)  # (B, V)
    greedy = temperature <= 0
    logp = sampling_logprobs(logits, temperature, top_p)
    # inverse-CDF draw: one uniform per row, from the row's own generator when it has one
    uniform = torch.rand(len(logits), dtype=torch.float64)  # float32's grid (6e-8) would be coarser than such tails
    for b, gen in enumerate(generators):
        if gen is not None:
            uniform[b] = torch.rand((), generator=gen, dtype=torch.float64)
    # in float64: a float32 running sum near 1 moves in steps of 6e-8, so a large vocabulary's tail tokens (2e-9 each
    # at V = 49152) would be drawn at 0 or ~60x the probability recorded for them
    probs = logp.double().exp()
    cdf = probs.cumsum(-1)  # (B, V)
    ids = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).squeeze(-1)
    # float rounding can push the draw past the end; fall back to the last token with mass
    last = (probs > 0).long().cumsum(-1).argmax(-1)
    ids = torch.minimum(ids, last)
    ids = torch.where(greedy, logits.argmax(-1), ids)
    chosen = logp.gather(-1, ids[:, None]).squeeze(-1)
    return ids, torch.where(greedy, torch.zeros_like(chosen), chosen)


def _within(logits: torch.Tensor, vocab: int | None) -> torch.Tensor:
    """`logits` with the ids from `vocab` on at -inf. Qwen2.5 embeds 151,936 rows for 151,665 tokens: an id past the
    tokenizer has no text, so it must never be sampled, and the trainer must score the same distribution. With as
    many rows as tokens, or fewer (Gemma 3's added tokens lie past its rows), the logits are returned as they are."""
    if vocab is None or vocab >= logits.shape[-1]:
        return logits
    return logits.masked_fill(torch.arange(logits.shape[-1], device=logits.device) >= vocab, float("-inf"))
