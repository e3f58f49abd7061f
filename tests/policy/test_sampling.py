import math

import pytest
import torch

from harnessrl.policy.sampling import sample_next, sampling_logprobs


def _logits(*probs: float) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probs]])


def test_top_p_renormalises_the_nucleus_and_reports_logprobs_under_it():
    # probs 0.5, 0.3, 0.2 with top_p 0.6: the nucleus is {0, 1}, renormalised to 0.625 / 0.375
    seen = set()
    for seed in range(200):
        ids, logprobs = sample_next(
            _logits(0.5, 0.3, 0.2), torch.tensor([1.0]), torch.tensor([0.6]), [torch.Generator().manual_seed(seed)]
        )
        token = int(ids[0])
        seen.add(token)
        assert math.isclose(float(logprobs[0]), math.log({0: 0.625, 1: 0.375}[token]), rel_tol=1e-5)
    assert seen == {0, 1}


def test_temperature_scales_logits_before_sampling():
    # T = 2 turns probs (0.8, 0.2) into softmax(log p / 2) = (2/3, 1/3)
    ids, logprobs = sample_next(
        _logits(0.8, 0.2), torch.tensor([2.0]), torch.tensor([1.0]), [torch.Generator().manual_seed(0)]
    )
    expected = {0: 2 / 3, 1: 1 / 3}[int(ids[0])]
    assert math.isclose(float(logprobs[0]), math.log(expected), rel_tol=1e-5)


def test_greedy_takes_the_argmax_with_logprob_zero():
    ids, logprobs = sample_next(_logits(0.2, 0.7, 0.1), torch.tensor([0.0]), torch.tensor([1.0]), [None])
    assert ids.tolist() == [1] and logprobs.tolist() == [0.0]


def test_frequencies_follow_the_distribution_and_a_seed_repeats():
    logits = _logits(0.1, 0.6, 0.3).repeat(4000, 1)
    ones = torch.ones(4000)
    ids, _ = sample_next(logits, ones, ones, [None] * 4000)
    freq = torch.bincount(ids, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.1, 0.6, 0.3]), atol=0.03)
    draw = [
        sample_next(logits[:8], ones[:8], ones[:8], [torch.Generator().manual_seed(b) for b in range(8)])[0]
        for _ in range(2)
    ]
    assert torch.equal(draw[0], draw[1])


def test_a_large_vocabularys_tail_is_drawn_by_the_exact_inverse_cdf_of_the_rows_uniform():
    """V = 49152 (SmolLM2's), one token at ~0.9999 and a flat tail of 2e-9 each. A float32 running sum near 1 moves
    in steps of 6e-8: most tail tokens could never be drawn and some were drawn at ~60x their recorded probability.
    Seeds whose uniform lands in the tail must draw the token the exact (float64) inverse CDF names."""
    vocab = 49152
    logits = torch.zeros(1, vocab)
    logits[0, 0] = 20.0  # the tail: exp(-20) / Z ~ 2.06e-9 each
    probs = torch.softmax(logits[0].double(), -1)
    cdf = probs.cumsum(-1)
    tail = 1 - float(probs[0])
    uniforms = {
        s: float(torch.rand((), generator=torch.Generator().manual_seed(s), dtype=torch.float64)) for s in range(60_000)
    }
    seeds = [s for s, u in uniforms.items() if u > 1 - tail][:3]
    assert seeds  # ~6 expected among 60,000
    for seed in seeds:
        ids, logp = sample_next(logits, torch.ones(1), torch.ones(1), [torch.Generator().manual_seed(seed)])
        exact = int(torch.searchsorted(cdf, torch.tensor([uniforms[seed]], dtype=torch.float64), right=True))
        assert int(ids) == exact > 0 and float(logp) == pytest.approx(math.log(float(probs[exact])), rel=1e-5)


def test_zero_probability_tokens_are_never_drawn():
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).repeat(2000, 1)
    ids, logprobs = sample_next(logits, torch.ones(2000), torch.ones(2000), [None] * 2000)
    assert set(ids.tolist()) == {0, 2}
    assert torch.allclose(logprobs, torch.full((2000,), math.log(0.5)))


def test_a_subnormal_temperature_samples_like_a_tiny_one_with_finite_logprobs():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    for t in (1e-40, 1e-44, 1e-7):  # float32 subnormals overflowed logits / T to inf: NaN logprobs, token 0
        temperature, top_p = torch.full((3,), t), torch.tensor([1.0, 0.5, 0.9])
        ids, logprobs = sample_next(logits, temperature, top_p, [None] * 3)
        assert torch.isfinite(logprobs).all() and torch.equal(ids, logits.argmax(-1))
        assert torch.isfinite(sampling_logprobs(logits, temperature, top_p).gather(-1, ids[:, None])).all()


def test_rows_past_the_tokenizer_are_never_drawn_and_as_many_or_fewer_change_nothing():
    """Qwen2.5 embeds 151,936 rows for 151,665 tokens: an id past the tokenizer has no text. With `vocab` (the
    tokenizer's size) below the rows, those ids get no probability, greedy included; at or above it (tiny: as many;
    Gemma 3: added tokens past the rows) the distribution is exactly the one without."""
    logits = torch.randn(3000, 8, generator=torch.Generator().manual_seed(0))
    logits[:, 5:] += 4.0  # the unused rows are the likeliest
    temperature, top_p = torch.ones(3000), torch.tensor([1.0, 0.9, 0.5]).repeat(1000)
    temperature[:2] = 0.0  # greedy rows too
    ids, logprobs = sample_next(logits, temperature, top_p, [None] * 3000, vocab=5)
    assert int(ids.max()) < 5 and len(set(ids.tolist())) == 5
    logp = sampling_logprobs(logits, temperature, top_p, vocab=5)
    assert torch.isinf(logp[:, 5:]).all() and torch.allclose(logp.gather(-1, ids[:, None])[2:, 0], logprobs[2:])
    seeded = [torch.Generator().manual_seed(b) for b in range(8)]
    plain = sample_next(logits[:8], temperature[:8], top_p[:8], seeded)
    for vocab in (8, 9):
        seeded = [torch.Generator().manual_seed(b) for b in range(8)]
        same = sample_next(logits[:8], temperature[:8], top_p[:8], seeded, vocab=vocab)
        assert torch.equal(same[0], plain[0]) and torch.equal(same[1], plain[1])
        assert torch.equal(
            sampling_logprobs(logits, temperature, top_p, vocab=vocab), sampling_logprobs(logits, temperature, top_p)
        )


def test_top_p_zero_keeps_the_likeliest_token_alone():
    # OpenAI takes top_p 0 (the gateway and SamplingParams refuse it; the sampling functions still take it): the top
    # token, at probability 1; every token was dropped instead, giving token 0 at a NaN logprob
    logits = _logits(0.2, 0.5, 0.3).repeat(2, 1)
    ids, logprobs = sample_next(logits, torch.ones(2), torch.zeros(2), [None, torch.Generator().manual_seed(0)])
    assert ids.tolist() == [1, 1] and logprobs.tolist() == [0.0, 0.0]
    logp = sampling_logprobs(logits, torch.ones(2), torch.zeros(2), keep=torch.tensor([1, 2]))
    assert logp[0].tolist() == [float("-inf"), 0.0, float("-inf")] and torch.isfinite(logp[1, 1:]).all()
