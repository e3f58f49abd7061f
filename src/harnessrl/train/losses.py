"""Policy-gradient losses, per token, and how they are aggregated over a batch. Pure tensor functions.

Shapes: (B, T) everywhere, aligned so that position t scores token ids[:, t + 1] (see
`token_logprobs`). `mask` is 1 on tokens that carry loss.

Off-policy: `anchor_logp` is the log-probability the ratio is taken against. In "behaviour" mode it
is the logprob recorded when the token was sampled, so one code path serves synchronous and
asynchronous (stale) rollouts. In "decoupled" mode (Hilton et al. 2022, "Batch size-invariance for
policy optimization"; AReaL) it is the proximal policy's logprob (the trainer's weights before this
update, no grad) and each token is re-weighted by the truncated importance weight
min(pi_prox / pi_behaviour, cap) (truncated IS as in Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training").
"""

from __future__ import annotations

from typing import Literal

import torch

from harnessrl.policy.sampling import sampling_logprobs

Aggregation = Literal["token", "sequence", "constant"]


def token_logprobs(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    with_entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), each (B, T - 1): logp[:, t] = log pi(ids[:, t + 1] | ids[:, :t + 1]).

    `row_logprobs` on every position of (B, T, V) logits; `temperature` and `top_p` are (B, T - 1).
    """
    rows, vocab = ids[:, 1:].shape, logits.shape[-1]
    flat = [None if x is None else x.reshape(-1) for x in (temperature, top_p)]
    logp, entropy = row_logprobs(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1), *flat, with_entropy_grad)
    return logp.reshape(rows), entropy.reshape(rows)


def row_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    with_entropy_grad: bool = False,
    vocab: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), each (N,): the log-probability of each row's target under its logits (N, V).

    With `temperature` and `top_p` ((N,), how each token was sampled), pi is the distribution
    the sampler drew from (policy.sampling.sampling_logprobs: softmax(logits / T) cut to the top-p
    nucleus, the scored token always kept, no id from `vocab` on), so the ratio against the recorded logprob
    is 1 on policy.
    Without them it is the model's own softmax (SFT, T = 1). The entropy is that distribution's, in fp32,
    differentiable only with `with_entropy_grad` (an entropy term in the loss).
    """
    logits = logits.float()
    if temperature is None and top_p is None:
        logp_all = torch.log_softmax(logits, dim=-1)
    else:
        temperature = torch.ones(len(targets)) if temperature is None else temperature
        top_p = torch.ones(len(targets)) if top_p is None else top_p
        logp_all = sampling_logprobs(logits, temperature, top_p, keep=targets, vocab=vocab)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    if with_entropy_grad and torch.is_grad_enabled():  # an entropy term in the loss
        kept = torch.isfinite(logp_all)  # outside the nucleus: p = 0 and no gradient (entr's is inf x 0 there)
        finite = logp_all.masked_fill(~kept, 0.0)
        entropy = -(finite.exp() * kept * finite).sum(-1)
    else:
        with torch.no_grad():  # a diagnostic: no graph through the (N, V) products
            entropy = torch.special.entr(logp_all.exp()).sum(-1)
    return logp, entropy


def ppo_clip_loss(
    logp: torch.Tensor,
    anchor_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip (Schulman et al. 2017) as GRPO applies it per token; returns (loss, ratio).

    loss = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(logp - anchor_logp).
    Departures: the clip range is asymmetric (DAPO, Yu et al. 2025, "clip-higher": eps_high > eps_low
    leaves room for unlikely tokens to grow); `dual_clip` (Ye et al. 2020) bounds the objective at
    dual_clip * A when A < 0, so a stale token with a huge ratio cannot dominate the batch.
    """
    ratio = torch.exp(logp - anchor_logp)
    objective = torch.minimum(ratio * advantages, ratio.clamp(1 - eps_low, 1 + eps_high) * advantages)
    if dual_clip is not None:
        objective = torch.where(advantages < 0, torch.maximum(objective, dual_clip * advantages), objective)
    return -objective, ratio


def cispo_loss(
    logp: torch.Tensor,
    anchor_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = 1.0,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, 2025): loss = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp; returns (loss, ratio).

    The importance weight is clipped and detached instead of the update being clipped away, so
    every token keeps a gradient (PPO zeroes it outside the trust region). MiniMax clips only from
    above; eps_low = 1 (the default) reproduces that.
    """
    ratio = torch.exp(logp - anchor_logp)
    weight = ratio.clamp(1 - eps_low, 1 + eps_high).detach()
    return -weight * advantages * logp, ratio


def policy_shaping_loss(logp: torch.Tensor, advantages: torch.Tensor, gamma: float = 0.1) -> torch.Tensor:
    """LUFFY's policy shaping (Yan et al., 2025) for off-policy tokens (an expert's demonstration in a group):
    loss = -A p / (p + gamma), p = exp(logp). Its gradient -A gamma p / (p + gamma)^2 grad(logp) lifts a
    token the policy finds unlikely more than the importance ratio p would, and fades as p nears 1."""
    p = logp.exp()
    return -advantages * p / (p + gamma)


def kl_penalty(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    kind: Literal["k1", "k3"],
    ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimates on tokens sampled from pi (Schulman 2020, "Approximating KL").

    k1 = log pi - log pi_ref (unbiased, can be negative); k3 = exp(-k1) + k1 - 1 (unbiased for the
    value, always >= 0, lower variance; the estimator GRPO uses). The tokens were sampled by the
    behaviour policy, not pi: with `ratio` (pi / pi_behaviour) the estimate is importance-weighted, which
    removes that bias (DeepSeek-V3.2, eq. 7; TRL's `use_bias_correction_kl`, where it also keeps the
    ratio's gradient).
    """
    k1 = logp - ref_logp
    if kind == "k1":
        kl = k1
    elif kind == "k3":
        kl = torch.exp(-k1) + k1 - 1
    else:
        raise ValueError(f"unknown KL estimator {kind!r}")
    return kl if ratio is None else kl * ratio


def truncated_is_weight(prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float | None) -> torch.Tensor:
    """min(pi_prox / pi_behaviour, cap), detached: the decoupled objective's per-token weight."""
    weight = torch.exp(prox_logp - behaviour_logp).detach()
    return weight if cap is None else weight.clamp(max=cap)


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    how: Aggregation,
    num_sequences: int,
    num_tokens: int,
    norm_tokens: int = 1024,
) -> torch.Tensor:
    """Reduce a micro-batch's per-token loss with normalisers counted over the whole batch.

    The normalisers are global so gradient accumulation over micro-batches equals one big batch.
    token     sum / (loss tokens in the batch): every token weighs the same (DAPO).
    sequence  mean over tokens within each sequence, then sum / (sequences in the batch): the
              original GRPO, which favours short answers (Liu et al. 2025).
    constant  sum / (sequences x norm_tokens): Dr.GRPO's length-unbiased constant normaliser.
    """
    masked = torch.where(mask > 0, per_token, 0.0) * mask  # an inf off the mask must not make the sum NaN
    if how == "token":
        return masked.sum() / max(num_tokens, 1)
    if how == "sequence":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / max(num_sequences, 1)
    if how == "constant":
        return masked.sum() / (max(num_sequences, 1) * norm_tokens)
    raise ValueError(f"unknown aggregation {how!r}")
