"""Losses on toy numbers worked out by hand."""

import math

import pytest
import torch

from harnessrl.train import losses


def _grad(loss_fn, logp_value: float, anchor: float, adv: float, **kw) -> tuple[float, float]:
    logp = torch.tensor([[math.log(logp_value)]], requires_grad=True)
    loss, _ = loss_fn(logp, torch.tensor([[math.log(anchor)]]), torch.tensor([[adv]]), **kw)
    loss.sum().backward()
    return float(loss.detach()), float(logp.grad)


def test_token_logprobs_entropy_and_gradient_on_toy_logits():
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]], requires_grad=True)  # probs (1/4, 3/4) then (1/2, 1/2)
    ids = torch.tensor([[0, 1]])
    logp, entropy = losses.token_logprobs(logits, ids)
    assert logp.shape == (1, 1) and float(logp.detach()) == pytest.approx(math.log(0.75))
    assert float(entropy) == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    (-logp.sum()).backward()
    assert logits.grad[0, 0].tolist() == pytest.approx([0.25, -0.25])  # softmax - one-hot
    assert logits.grad[0, 1].tolist() == [0.0, 0.0]  # the last position predicts nothing


def test_ppo_clip_by_hand():
    # r = 0.5 / 0.4 = 1.25
    assert _grad(losses.ppo_clip_loss, 0.5, 0.4, 1.0, eps_low=0.2, eps_high=0.2) == pytest.approx(
        (-1.2, 0.0)
    )  # clipped
    assert _grad(losses.ppo_clip_loss, 0.5, 0.4, 1.0, eps_low=0.2, eps_high=0.28) == pytest.approx(
        (-1.25, -1.25)
    )  # clip-higher
    assert _grad(losses.ppo_clip_loss, 0.5, 0.4, -1.0, eps_low=0.2, eps_high=0.2) == pytest.approx(
        (1.25, 1.25)
    )  # A<0: min picks r
    # r = 0.3 / 0.5 = 0.6 < 1 - 0.2 with A < 0: clipped at 0.8, no gradient
    assert _grad(losses.ppo_clip_loss, 0.3, 0.5, -2.0, eps_low=0.2, eps_high=0.2) == pytest.approx((1.6, 0.0))
    # r = 9 with A = -1: the objective -9 is bounded at dual_clip * A = -3
    assert _grad(losses.ppo_clip_loss, 0.9, 0.1, -1.0, dual_clip=3.0) == pytest.approx((3.0, 0.0))
    assert _grad(losses.ppo_clip_loss, 0.9, 0.1, -1.0) == pytest.approx((9.0, 9.0))


def test_on_policy_ratios_are_one_and_the_gradient_is_minus_the_advantage():
    logp = torch.log(torch.tensor([[0.2, 0.7]])).requires_grad_()
    adv = torch.tensor([[2.0]])
    for fn in (losses.ppo_clip_loss, losses.cispo_loss):
        loss, ratio = fn(logp, logp.detach(), adv)
        assert ratio.tolist() == [[1.0, 1.0]]
        (grad,) = torch.autograd.grad(loss.sum(), logp)
        assert grad.tolist() == [[-2.0, -2.0]]


def test_cispo_keeps_a_clipped_weight_and_the_gradient():
    # r = 1.25 clipped to 1.2: loss = -1.2 * A * logp, gradient -1.2 * A even though clipped
    loss, grad = _grad(losses.cispo_loss, 0.5, 0.4, 1.0, eps_high=0.2)
    assert loss == pytest.approx(-1.2 * math.log(0.5)) and grad == pytest.approx(-1.2)
    # r = 0.5 / 0.25 = 2 with A = -1: weight 1.28, gradient +1.28
    assert _grad(losses.cispo_loss, 0.5, 0.25, -1.0)[1] == pytest.approx(1.28)


def test_kl_estimators_and_truncated_importance_weights():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert float(losses.kl_penalty(logp, ref, "k1")) == pytest.approx(math.log(2))
    assert float(losses.kl_penalty(logp, ref, "k3")) == pytest.approx(0.5 + math.log(2) - 1)
    assert float(losses.kl_penalty(logp, logp, "k3")) == 0.0
    prox, behaviour = torch.log(torch.tensor([0.6, 0.3])), torch.log(torch.tensor([0.1, 0.6]))
    assert losses.truncated_is_weight(prox, behaviour, 3.0).tolist() == pytest.approx([3.0, 0.5])


def test_aggregations_with_batch_wide_normalisers():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert float(losses.aggregate(per_token, mask, "token", 2, 4)) == 2.5
    assert float(losses.aggregate(per_token, mask, "sequence", 2, 4)) == 3.0  # (6/3 + 4/1) / 2
    assert float(losses.aggregate(per_token, mask, "constant", 2, 4, norm_tokens=10)) == 0.5
    # two micro-batches with the batch's normalisers sum to the whole batch's loss
    for how in ("token", "sequence", "constant"):
        whole = losses.aggregate(per_token, mask, how, 2, 4, 10)
        parts = sum(losses.aggregate(per_token[i : i + 1], mask[i : i + 1], how, 2, 4, 10) for i in range(2))
        assert float(parts) == pytest.approx(float(whole))
