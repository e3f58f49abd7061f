import random

import torch

from harnessrl.policy import Policy
from harnessrl.policy.tiny import build_tiny
from harnessrl.train import episode_sequences
from harnessrl.train.batches import micro_batch, micro_batches, tail_logits, tail_logprobs
from harnessrl.train.losses import token_logprobs
from harnessrl.train.sequences import Sequence
from tests.train.helpers import sampled_groups


def _sequences() -> list[Sequence]:
    """Two groups of four sampled replies (a shared prompt each), a two-turn sequence whose second
    prompt carries no loss, and one whose loss starts at token 1 (an empty prefix)."""
    policy = Policy.load("tiny")
    try:
        groups = sampled_groups(policy, groups=2, size=4, max_tokens=8)
    finally:
        policy.close()
    seqs = [s for i, e in enumerate(e for g in groups for e in g) for s in episode_sequences(e, 0.1 * i - 0.3)]
    a = seqs[0]
    turns = Sequence(
        ids=a.ids + a.ids[:5] + a.ids[-3:], loss_mask=a.loss_mask + [0] * 5 + [1] * 3,
        sampled_logprobs=a.sampled_logprobs + [0.0] * 5 + [-1.0] * 3, versions=a.versions + [-1] * 5 + [0] * 3, advantage=0.7,
    )  # fmt: skip
    early = Sequence(
        ids=a.ids[:6],
        loss_mask=[0, 1, 1, 0, 1, 1],
        sampled_logprobs=[0.0, -1, -1, 0, -1, -1],
        versions=[-1, 0, 0, -1, 0, 0],
        advantage=-0.4,
    )
    return [*seqs, turns, early]


def _matches_whole_rows(model, seqs: list[Sequence], mb) -> None:
    """The micro-batch's logprobs and gradients are those of each whole sequence run on its own."""
    expected, reference = [], torch.zeros(())
    for s in seqs:
        ids = torch.tensor([s.ids])
        logp = token_logprobs(model(input_ids=ids).logits, ids)[0][0]
        mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
        expected.append(logp[mask])
        reference = reference + s.advantage * logp[mask].sum()
    reference.backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    logp, _ = token_logprobs(tail_logits(model, mb), mb.ids)
    for row, (s, want) in enumerate(zip(seqs, expected)):
        mask = mb.mask[row].bool()
        assert torch.allclose(logp[row][mask], want, atol=1e-5), row
        assert mb.behaviour[row][mask].tolist() == [lp for lp, m in zip(s.sampled_logprobs[1:], s.loss_mask[1:]) if m]
    shared = (logp * mb.mask * mb.advantages).sum()
    assert torch.allclose(shared, reference, atol=1e-4)
    shared.backward()
    for p, want in zip(model.parameters(), expected_grads):  # relative to the tensor's norm: CPUs round differently
        assert float((p.grad - want).norm()) <= 1e-4 * float(want.norm()) + 1e-7


def test_shared_prompts_give_the_full_forward_logprobs_and_gradients():
    seqs = _sequences()
    model, _ = build_tiny(seed=0)
    model.train()
    mb = micro_batch(seqs)
    assert mb.prefix_ids.shape[0] == 3  # the two prompts and the empty prefix
    assert mb.mask.sum() == sum(s.loss_tokens for s in seqs)  # none has loss on token 0
    _matches_whole_rows(model, seqs, mb)


def test_distinct_prompts_share_the_head_every_row_begins_with():
    """SFT on distinct tasks: one system prompt and tool schemas, then each task's own prompt and
    reply. The head runs once; every row's tail starts after it."""
    rng = random.Random(0)
    head = [rng.randrange(3, 200) for _ in range(40)]
    seqs = []
    for first, prompt, reply in [(3, 5, 9), (4, 8, 4), (5, 3, 12)]:  # distinct first tokens after the head
        ids = head + [first] + [rng.randrange(3, 200) for _ in range(prompt + reply)]
        mask = [0] * (len(head) + 1 + prompt) + [1] * reply
        seqs.append(Sequence(ids=ids, loss_mask=mask, sampled_logprobs=[-rng.randrange(1, 12) / 4 * m for m in mask],
                             versions=[0 if m else -1 for m in mask], advantage=rng.uniform(-1, 1)))  # fmt: skip
    mb = micro_batch(seqs)
    assert mb.prefix_ids.tolist() == [head]
    assert mb.positions[:, 0].tolist() == [len(head)] * 3
    model, _ = build_tiny(seed=0)
    model.train()
    _matches_whole_rows(model, seqs, mb)
    assert micro_batch(seqs[:1]).prefix_ids.shape[1] == 0  # one row alone shares nothing


def test_without_shared_prompts_the_batch_is_one_plain_forward():
    seqs = _sequences()
    distinct = [seqs[0], seqs[4]]  # one sequence of each group: nothing to share
    mb = micro_batch(distinct)
    assert mb.prefix_ids.shape[1] == 0 and mb.ids.shape[1] == max(len(s) for s in distinct)
    assert mb.mask.sum() == sum(s.loss_tokens for s in distinct)


def test_projecting_only_the_loss_positions_changes_no_logprob_entropy_or_gradient():
    seqs = _sequences()
    model, _ = build_tiny(seed=0)
    model.train()
    mb = micro_batch(seqs)
    mb.temperature = torch.rand(mb.mask.shape) + 0.5  # scored as sampled: temperature and nucleus per token
    mb.top_p = torch.where(torch.rand(mb.mask.shape) < 0.5, 0.9, 1.0)
    on = mb.mask.bool()
    for sampled in (False, True):
        sampling = (mb.temperature, mb.top_p) if sampled else ()
        results = []
        for ours in (False, True):
            model.zero_grad()
            if ours:
                logp, entropy = tail_logprobs(model, mb, sampled=sampled, with_entropy_grad=True)
            else:
                logp, entropy = token_logprobs(tail_logits(model, mb), mb.ids, *sampling, with_entropy_grad=True)
            ((logp - 0.1 * entropy) * mb.mask * mb.advantages).sum().backward()
            results.append((logp.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]))
        (full_logp, full_entropy, want), (logp, entropy, got) = results
        assert torch.allclose(logp[on], full_logp[on], atol=1e-5) and torch.allclose(
            entropy[on], full_entropy[on], atol=1e-5
        )
        assert not logp[~on].any() and not entropy[~on].any()  # off the loss mask: nothing computed
        for g, w in zip(got, want):
            assert float((g - w).norm()) <= 1e-4 * float(w.norm()) + 1e-7


def test_micro_batches_keep_both_the_token_and_the_loss_token_budget():
    def seq(length: int, loss: int) -> Sequence:
        return Sequence(ids=[5] * length, loss_mask=[0] * (length - loss) + [1] * loss, sampled_logprobs=[0.0] * length,
                        versions=[0] * length)  # fmt: skip

    seqs = [seq(100, 60), seq(90, 50), seq(80, 10), seq(70, 10), seq(20, 5)]
    assert [[len(s) for s in mb] for mb in micro_batches(seqs, 300)] == [[100, 90, 80], [70, 20]]
    assert [[len(s) for s in mb] for mb in micro_batches(seqs, 300, loss_budget=65)] == [[100], [90, 80], [70, 20]]
    assert [[len(s) for s in mb] for mb in micro_batches(seqs, 10_000, loss_budget=70)] == [[100], [90, 80, 70], [20]]
