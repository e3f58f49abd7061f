"""Next-token sampling with the logprob of each draw under the distribution it was drawn from."""

from __future__ import annotations

import torch


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generators: list[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return (ids (B,), logprobs (B,)).

    Row b samples from softmax(logits[b] / temperature[b]) restricted to its top-p nucleus and
    renormalised (Holtzman et al. 2020); the returned logprob is taken under that same adjusted
    distribution, so an importance ratio against it is exact. temperature 0 means greedy: the
    argmax, with logprob 0.0 (a point mass). Each row draws from its own generator when given one,
    so a seeded request samples the same tokens whatever else shares its batch.
    """
    logits = logits.float()  # (B, V)
    greedy = temperature <= 0
    logp = torch.log_softmax(logits / temperature.clamp_min(1e-6)[:, None], dim=-1)  # (B, V)
    if bool((top_p < 1).any()):
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # (B, V) mass ranked above each token
        drop_sorted = mass_before >= top_p[:, None]  # the top token always stays (mass_before = 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    # inverse-CDF draw: one uniform per row, from the row's own generator when it has one
    uniform = torch.rand(len(logits))
    for b, gen in enumerate(generators):
        if gen is not None:
            uniform[b] = torch.rand((), generator=gen)
    probs = logp.exp()
    cdf = probs.cumsum(-1)  # (B, V)
    ids = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).squeeze(-1)
    # float rounding can push the draw past the end; fall back to the last token with mass
    last = (probs > 0).long().cumsum(-1).argmax(-1)
    ids = torch.minimum(ids, last)
    ids = torch.where(greedy, logits.argmax(-1), ids)
    chosen = logp.gather(-1, ids[:, None]).squeeze(-1)
    return ids, torch.where(greedy, torch.zeros_like(chosen), chosen)
