import copy
import json
import math
import os
import random
import subprocess
import sys
import textwrap
from functools import partial

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM

from harnessrl.policy import Policy
from harnessrl.policy.tiny import build_tiny
from harnessrl.policy.toolformat import name_tokens
from harnessrl.train import LoraConfig, TrainConfig, Trainer, episode_sequences, lora_for
from harnessrl.train.batches import micro_batches
from harnessrl.train.checkpoint import latest_checkpoint
from harnessrl.train.sequences import Sequence
from harnessrl.train.trainer import _by_prompt, _lr_factor, clipped
from harnessrl.types import Outcome
from tests.train.helpers import sampled_groups


@pytest.fixture
def fresh_policy():
    p = Policy.load("tiny")
    yield p
    p.close()


def _mean_logp(model, episodes) -> float:
    from harnessrl.train.losses import token_logprobs

    total, count = 0.0, 0
    with torch.no_grad():
        for e in episodes:
            (seq,) = episode_sequences(e)
            logp, _ = token_logprobs(model(torch.tensor([seq.ids])).logits, torch.tensor([seq.ids]))
            mask = torch.tensor(seq.loss_mask[1:], dtype=torch.bool)
            total, count = total + float(logp[0][mask].sum()), count + int(mask.sum())
    return total / count


def test_an_on_policy_update_has_unit_ratios_moves_toward_the_advantage_and_logs(fresh_policy, tmp_path):
    groups = sampled_groups(fresh_policy)
    trainer = Trainer(
        fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lr=1e-3), run_dir=tmp_path, policy=fresh_policy
    )
    before = {id(e): e for g in groups for e in g}
    metrics = trainer.rl_step(groups)
    assert metrics["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["policy/ratio_min"] == pytest.approx(1.0, abs=1e-4) and metrics["policy/ratio_max"] == pytest.approx(
        1.0, abs=1e-4
    )
    assert metrics["policy/logprob_gap"] < 1e-4 and metrics["policy/clip_frac_high"] == 0.0
    assert metrics["policy/staleness"] == 0.0
    assert fresh_policy.version == 1 and metrics["policy_version"] == 1 and metrics["step"] == 1
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    for key in ("step", "policy_version", "loss/policy", "reward/mean", "reward/e_share", "perf/tokens_per_s",
                "policy/entropy", "policy/clip_frac_low", "policy/ratio_mean", "policy/logprob_gap", "optim/grad_norm"):  # fmt: skip
        assert key in line, key
    # the update raised the likelihood of above-average episodes relative to below-average ones
    episodes = list(before.values())
    mean = sum(e.reward.total for e in episodes) / len(episodes)
    good = [e for e in episodes if e.reward.total > mean]
    bad = [e for e in episodes if e.reward.total <= mean]
    old, _ = build_tiny(seed=0)
    delta_good = _mean_logp(fresh_policy.model, good) - _mean_logp(old, good)
    delta_bad = _mean_logp(fresh_policy.model, bad) - _mean_logp(old, bad)
    assert delta_good > delta_bad


def test_stale_episodes_are_corrected_against_their_behaviour_logprobs(fresh_policy):
    groups = sampled_groups(fresh_policy)
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lr=1e-2), policy=fresh_policy)
    trainer.rl_step(groups)
    stale = trainer.rl_step(groups)  # same episodes, sampled one version ago
    assert stale["policy/staleness"] == 1.0
    assert "policy/logprob_gap" not in stale  # no token was sampled by the current version
    assert abs(stale["policy/ratio_mean"] - 1.0) > 1e-3


def test_degenerate_groups_are_dropped_and_counted(fresh_policy):
    groups = sampled_groups(fresh_policy)
    for e in groups[1]:
        e.reward.total = 0.5
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer)
    metrics = trainer.rl_step(groups)
    assert metrics["rollout/groups_dropped_equal"] == 1 and metrics["rollout/sequences"] == 4
    skipped = trainer.rl_step([groups[1]])  # nothing left to learn from: no optimizer step
    assert skipped["perf/skipped_update"] == 1 and skipped["step"] == trainer.step == 1


def test_outcome_filtering_drops_groups_whose_verdicts_tie_even_where_rewards_differ(fresh_policy):
    groups = sampled_groups(fresh_policy)  # rewards differ within each group
    for e in groups[0]:  # all failed: penalties differ, the verdict does not
        e.outcome = Outcome(success=False)
    for i, e in enumerate(groups[1]):
        e.outcome = Outcome(success=i == 0)
    by_reward = Trainer(fresh_policy.model, fresh_policy.tokenizer).rl_step(copy.deepcopy(groups))
    assert by_reward["rollout/groups_dropped_equal"] == 0 and by_reward["rollout/sequences"] == 8
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(filter_groups_by="outcome"))
    by_outcome = trainer.rl_step(copy.deepcopy(groups))
    assert by_outcome["rollout/groups_dropped_equal"] == 1 and by_outcome["rollout/sequences"] == 4
    groups[1][0].outcome = None  # a harness without a verdict: its rewards decide
    assert trainer.rl_step(groups)["rollout/groups_dropped_equal"] == 1


def test_micro_batching_gives_the_same_update_as_one_batch(fresh_policy):
    groups = sampled_groups(fresh_policy)
    results = []
    for budget in (100_000, 16):  # one micro-batch vs one sequence per micro-batch
        for aggregation in ("token", "sequence"):
            trainer = Trainer(
                fresh_policy.model, fresh_policy.tokenizer, TrainConfig(token_budget=budget, aggregation=aggregation)
            )
            m = trainer.rl_step(groups)
            results.append((budget, aggregation, m["loss/policy"], m["optim/grad_norm"], m["perf/micro_batches"]))
    one_token, one_seq, many_token, many_seq = results
    assert one_token[4] == 1 and many_token[4] == 8
    for many, one in ((many_token, one_token), (many_seq, one_seq)):
        assert many[2] == pytest.approx(one[2], abs=1e-6) and many[3] == pytest.approx(one[3], rel=1e-5)
    # a logit budget (loss tokens x vocabulary) splits the batch too (large vocabularies), the same update
    capped = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(token_budget=100_000, logit_budget=2**16))
    m = capped.rl_step(groups)
    sequences = [s for group in groups for e in group for s in episode_sequences(e, 0.0)]
    expected = micro_batches(sequences, 100_000, capped.micro_loss_tokens)
    assert m["perf/micro_batches"] == len(expected) > 1
    assert m["loss/policy"] == pytest.approx(one_token[2], abs=1e-6)


def test_the_update_equals_the_loss_of_every_whole_sequence_forwarded_alone(fresh_policy):
    from harnessrl.train.advantages import group_advantages
    from harnessrl.train.losses import aggregate, ppo_clip_loss, token_logprobs

    groups = sampled_groups(fresh_policy)
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(grad_clip=None))
    model = copy.deepcopy(trainer.model)
    metrics = trainer.rl_step(groups)
    # the unoptimised computation: no shared prompts, no trimmed positions, one sequence at a time
    seqs = [
        s
        for g in groups
        for e, adv in zip(g, group_advantages([e.reward.total for e in g], "grpo"))
        for s in episode_sequences(e, adv)
    ]
    tokens, loss = sum(s.loss_tokens for s in seqs), torch.zeros(())
    for s in seqs:
        ids = torch.tensor([s.ids])
        logp, _ = token_logprobs(model(input_ids=ids).logits, ids)
        per_token, _ = ppo_clip_loss(
            logp, torch.tensor([s.sampled_logprobs[1:]]), torch.tensor([[s.advantage]]), 0.2, 0.28, 3.0
        )
        loss = loss + aggregate(per_token, torch.tensor([s.loss_mask[1:]]).float(), "token", len(seqs), tokens)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), math.inf)
    assert metrics["loss/policy"] == pytest.approx(float(loss.detach()), abs=1e-6)
    assert metrics["optim/grad_norm"] == pytest.approx(float(grad_norm), rel=1e-4)
    assert metrics["perf/loss_tokens"] == tokens and metrics["perf/tokens"] == sum(len(s) for s in seqs)


def test_decoupled_cispo_with_kl_starts_at_unit_weights_and_zero_kl(fresh_policy):
    config = TrainConfig(
        loss="cispo",
        off_policy="decoupled",
        kl="k3",
        kl_coef=0.1,
        kl_bias_correction=True,
        advantage="rloo",
        aggregation="constant",
    )
    metrics = Trainer(fresh_policy.model, fresh_policy.tokenizer, config).rl_step(sampled_groups(fresh_policy))
    assert metrics["policy/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["policy/kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["policy/is_weight_capped"] == 0.0


def test_lora_trains_adapters_pushes_merged_weights_and_saves_a_plain_folder(fresh_policy, tmp_path):
    trainer = Trainer(
        fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lr=1e-2, lora=LoraConfig(r=4)), policy=fresh_policy
    )
    assert all("lora_" in n for n, p in trainer.model.named_parameters() if p.requires_grad)
    before = {k: v.clone() for k, v in fresh_policy.model.state_dict().items()}
    trainer.rl_step(sampled_groups(fresh_policy))
    after = fresh_policy.model.state_dict()
    assert fresh_policy.version == 1 and set(after) == set(before)
    assert not torch.equal(
        after["model.layers.0.self_attn.q_proj.weight"], before["model.layers.0.self_attn.q_proj.weight"]
    )
    path = trainer.save(tmp_path / "checkpoints")
    loaded = AutoModelForCausalLM.from_pretrained(path)
    ids = torch.tensor([[1, 5, 9, 42]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, fresh_policy.model(ids).logits, atol=1e-5)
    assert (path / "adapter" / "adapter_config.json").is_file()


@pytest.mark.parametrize("lora", [None, LoraConfig(r=4)])
def test_resume_continues_exactly(fresh_policy, tmp_path, lora):
    groups = sampled_groups(fresh_policy)
    config = TrainConfig(lr=1e-2, schedule="cosine", total_steps=4, warmup_steps=1, lora=lora)
    straight = Trainer(fresh_policy.model, fresh_policy.tokenizer, config)
    for _ in range(3):
        straight.rl_step(groups)
    first = Trainer(fresh_policy.model, fresh_policy.tokenizer, config)
    first.rl_step(groups)
    first.save(tmp_path / "ck", cursor={"position": 1})
    resumed = Trainer(fresh_policy.model, fresh_policy.tokenizer, config)
    assert resumed.resume(latest_checkpoint(tmp_path / "ck")) == {"position": 1} and resumed.step == 1
    for _ in range(2):
        last = resumed.rl_step(groups)
    assert last["step"] == 3 and last["optim/lr"] == straight.optimizer.param_groups[0]["initial_lr"] * _lr_factor(
        config
    )(2)
    for (name, a), b in zip(straight.plain_state().items(), resumed.plain_state().values()):
        assert torch.equal(a, b), name


def test_a_resume_serves_the_version_its_weights_were_saved_at(fresh_policy, tmp_path):
    groups = sampled_groups(fresh_policy)
    first = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(), policy=fresh_policy)
    for _ in range(3):
        first.rl_step(groups)
    first.save(tmp_path / "ck")
    assert fresh_policy.version == 3
    later = Policy.load("tiny")  # a new process: its engine starts at version 0
    try:
        resumed = Trainer(later.model, later.tokenizer, TrainConfig(), policy=later)
        resumed.resume(latest_checkpoint(tmp_path / "ck"))
        assert later.version == 3  # not 1: versions never go back, so staleness and the metrics stay in order
        assert resumed.rl_step(groups)["policy_version"] == 4
    finally:
        later.close()


def test_a_resume_trains_at_this_configs_rate_and_logs_the_rate_each_step_used(fresh_policy, tmp_path):
    groups = sampled_groups(fresh_policy)
    first = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lr=1e-3, warmup_steps=2))
    assert first.rl_step(groups)["optim/lr"] == pytest.approx(5e-4)  # warm-up step 1 of 2 trains at half the rate
    first.save(tmp_path / "ck")
    config = TrainConfig(lr=5e-2, warmup_steps=2, betas=(0.8, 0.9), weight_decay=0.1)
    resumed = Trainer(fresh_policy.model, fresh_policy.tokenizer, config)
    resumed.resume(latest_checkpoint(tmp_path / "ck"))
    group = resumed.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (pytest.approx(5e-2), (0.8, 0.9), 0.1)
    assert resumed.rl_step(groups)["optim/lr"] == pytest.approx(5e-2)  # step 2: warmed up, at the new rate
    adapters = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lora=LoraConfig(r=4)))
    with pytest.raises(ValueError, match="the checkpoint trained lora None, this config asks lora"):
        adapters.resume(latest_checkpoint(tmp_path / "ck"))
    adapters.save(tmp_path / "lora")  # the adapters' alpha and dropout may change on resume, not their rank
    Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lora=LoraConfig(r=4, alpha=8))).resume(
        latest_checkpoint(tmp_path / "lora")
    )
    with pytest.raises(ValueError, match="trained lora"):
        Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lora=LoraConfig(r=8))).resume(
            latest_checkpoint(tmp_path / "lora")
        )


@pytest.mark.parametrize(("precision", "gap"), [("fp32", 1e-4), ("bf16", 1e-2)])
def test_a_fresh_batch_at_temperature_and_top_p_is_scored_as_it_was_sampled(fresh_policy, precision, gap):
    """The trainer scores softmax(z / T) cut to the top-p nucleus, as the sampler drew from it: on policy the
    ratio is 1 and the train/sample gap is float noise (bf16 perturbs the body, never the final projection)."""
    groups = sampled_groups(fresh_policy, temperature=0.7, top_p=0.9)
    assert all(c.temperature == 0.7 and c.top_p == 0.9 for g in groups for e in g for c in e.calls)
    # scored at T = 1 without the nucleus (what the trainer used to do), the same batch is far off policy
    from harnessrl.train.batches import micro_batch, tail_logits
    from harnessrl.train.losses import token_logprobs

    mb = micro_batch([s for g in groups for e in g for s in episode_sequences(e)])
    with torch.no_grad():
        plain, _ = token_logprobs(tail_logits(fresh_policy.model, mb), mb.ids)
    assert float(((plain - mb.behaviour).abs() * mb.mask).sum() / mb.mask.sum()) > 0.1
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(precision=precision), policy=fresh_policy)
    metrics = trainer.rl_step(groups)
    assert metrics["perf/bf16"] == (precision == "bf16")
    assert metrics["policy/logprob_gap"] < gap
    for key in ("policy/ratio_min", "policy/ratio_mean", "policy/ratio_max"):
        assert metrics[key] == pytest.approx(1.0, abs=1e-4 if precision == "fp32" else 0.05), key


def test_greedy_calls_and_demonstrations_never_enter_a_ratio(fresh_policy):
    groups = sampled_groups(fresh_policy)
    greedy, demo = groups[0][0].calls[0], groups[0][1].calls[0]
    greedy.temperature, greedy.sampled_logprobs = 0.0, [0.0] * len(greedy.completion_ids)
    demo.demonstration, demo.sampled_logprobs = True, [0.0] * len(demo.completion_ids)
    plain = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(guidance="none")).rl_step(groups)
    assert plain["rollout/sequences"] == 6 and plain["policy/ratio_min"] == pytest.approx(1.0, abs=1e-4)
    metrics = Trainer(fresh_policy.model, fresh_policy.tokenizer).rl_step(groups)
    unsampled = len(greedy.completion_ids) + len(demo.completion_ids)
    assert metrics["rollout/unsampled_loss_tokens"] == unsampled
    assert metrics["rollout/sequences"] == 7  # the demonstration trains by policy shaping, the greedy reply not at all
    assert metrics["rollout/demonstrations"] == 1 and metrics["rollout/episodes"] == 7
    # a logprob of 0.0 taken as behaviour would give ratios far below 1; only real samples are in the ratio
    assert metrics["policy/ratio_min"] == pytest.approx(1.0, abs=1e-4)
    sft = Trainer(fresh_policy.model, fresh_policy.tokenizer).sft_step([e for g in groups for e in g])
    assert sft["rollout/sequences"] == 8  # SFT learns from demonstrations and greedy replies alike


def test_a_demonstration_in_a_group_is_learnt_where_it_beats_the_samples_and_unlearnt_where_it_trails(fresh_policy):
    from harnessrl.train.losses import policy_shaping_loss

    logp = torch.log(torch.tensor([0.01, 0.5, 0.99])).requires_grad_()
    policy_shaping_loss(logp, torch.tensor(2.0), gamma=0.1).sum().backward()
    p = logp.detach().exp()
    assert torch.allclose(logp.grad, -2.0 * 0.1 * p / (p + 0.1) ** 2)  # d/dlogp of -A p / (p + gamma), by hand
    groups = sampled_groups(fresh_policy, groups=2, size=5)
    for g, group in enumerate(groups):  # an expert's reply in place of a sample: the best of group 0, the worst of 1
        demo = group.pop(0)
        demo.calls[0].demonstration, demo.calls[0].sampled_logprobs = True, [0.0] * len(demo.calls[0].completion_ids)
        demo.reward = demo.reward.model_copy(update={"total": 10.0 if g == 0 else -10.0})
        group.append(demo)
    # the same step with and without the demonstrations' loss (shaping's gamma at this untrained model's p)
    plain = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lr=1e-3, guidance="none"))
    without = plain.rl_step(groups)
    assert without["rollout/sequences"] == 8 and "policy/guided_p" not in without
    best, worst = groups[0][-1], groups[1][-1]
    for mode in ("shaping", "nll"):
        guided = Trainer(
            fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lr=1e-3, guidance=mode, guidance_gamma=1e-3)
        )
        metrics = guided.rl_step(groups)
        assert metrics["rollout/demonstrations"] == 2 and metrics["rollout/episodes"] == 8
        assert metrics["rollout/sequences"] == 10 and 0 < metrics["policy/guided_p"] < 1
        assert metrics["policy/ratio_min"] == pytest.approx(1.0, abs=1e-4)  # the demonstrations are not in the ratio
        assert _mean_logp(guided.model, [best]) > _mean_logp(plain.model, [best]), mode
        assert _mean_logp(guided.model, [worst]) < _mean_logp(plain.model, [worst]), mode


def test_dropout_is_off_when_scoring_and_said_so(fresh_policy):
    model, _ = build_tiny(seed=0)
    model.config.attention_dropout = 0.5
    for module in model.modules():  # Qwen2 reads attention_dropout from its config at every forward
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    with pytest.warns(UserWarning, match="dropout is off"):
        trainer = Trainer(model, fresh_policy.tokenizer, TrainConfig(lora=LoraConfig(r=4, dropout=0.1)))
    assert not trainer.model.training
    groups = sampled_groups(fresh_policy)
    metrics = trainer.rl_step(groups)  # the policy sampled with the same weights and no dropout
    assert metrics["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_kl_bias_correction_multiplies_k3_by_the_ratio():
    from harnessrl.train.losses import kl_penalty

    logp, ref, ratio = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.tensor([[1.2, 0.5]])
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]  # exp(-k1) + k1 - 1, k1 = logp - ref
    assert kl_penalty(logp, ref, "k3")[0].tolist() == pytest.approx(k3)
    assert kl_penalty(logp, ref, "k3", ratio)[0].tolist() == pytest.approx([1.2 * k3[0], 0.5 * k3[1]])


def test_bf16_is_chosen_only_where_the_cpu_computes_it_natively():
    import subprocess
    import sys

    code = "from harnessrl.train.precision import resolve; print(*resolve('auto'), sep='|')"
    capped = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **capped}, capture_output=True, text=True)
    chosen, reason = out.stdout.strip().split("|")
    assert chosen == "fp32" and "auto" in reason, out
    with pytest.raises(ValueError, match="bf16 is now precision"):
        TrainConfig.model_validate({"bf16": True})


def test_ppo_epochs_take_several_steps_per_batch_and_the_clip_bites_after_the_first(fresh_policy):
    groups = sampled_groups(fresh_policy)
    config = TrainConfig(lr=3e-2, ppo_epochs=3, mini_batches=2, grad_clip=None)
    single = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lr=3e-2, grad_clip=None))
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, config, policy=fresh_policy)
    metrics = trainer.rl_step(groups)
    assert metrics["optim/steps"] == 6 and metrics["step"] == trainer.step == 1 and fresh_policy.version == 1
    assert metrics["policy/logprob_gap"] < 1e-4  # measured on the first step, before the weights moved
    # later steps score tokens the updated weights now rate differently: ratios leave 1 and the clip bites
    assert metrics["policy/ratio_max"] > 1 + config.eps_high or metrics["policy/ratio_min"] < 1 - config.eps_low
    assert metrics["policy/clip_frac_high"] + metrics["policy/clip_frac_low"] > 0
    one = single.rl_step(groups)  # one pass, one step: on policy throughout
    assert one["optim/steps"] == 1 and one["policy/clip_frac_high"] == one["policy/clip_frac_low"] == 0


def test_clip_fractions_count_where_each_loss_clips():
    ratio, advantages = torch.tensor([[0.5, 1.5, 0.5, 1.5]]), torch.tensor([[-1.0, -1.0, 1.0, 1.0]])
    ppo = clipped(ratio, advantages, TrainConfig(loss="ppo"))  # only where the gradient goes: A < 0 low, A > 0 high
    assert [m.tolist() for m in ppo] == [[[True, False, False, False]], [[False, False, False, True]]]
    cispo = clipped(ratio, advantages, TrainConfig(loss="cispo", eps_low=0.2))  # every clipped weight
    assert [m.tolist() for m in cispo] == [[[True, False, True, False]], [[False, True, False, True]]]


def test_mini_batches_are_reshuffled_but_keep_a_groups_samples_together():
    """Three groups of four samples (a prompt each): every pass orders the groups anew, each whole."""
    seqs = [
        Sequence(ids=[p, p, 9, i], loss_mask=[0, 0, 1, 1], sampled_logprobs=[0.0] * 4, versions=[0] * 4)
        for p in (3, 4, 5)
        for i in range(4)
    ]
    groups = _by_prompt(seqs)
    orders = [[s for g in random.Random(k).sample(groups, 3) for s in g] for k in range(6)]  # as the trainer
    for order in orders:
        assert sorted(map(id, order)) == sorted(map(id, seqs))
        assert all(len({s.ids[0] for s in order[i : i + 4]}) == 1 for i in range(0, 12, 4))
    assert len({tuple(s.ids[0] for s in order) for order in orders}) > 1


def test_entropy_coef_below_zero_sharpens_the_policy_and_above_zero_spreads_it(fresh_policy):
    from harnessrl.train.losses import token_logprobs

    groups = sampled_groups(fresh_policy)
    episodes = [e for g in groups for e in g]

    def entropy(model) -> float:  # mean over the batch's loss tokens
        total, count = 0.0, 0
        with torch.no_grad():
            for e in episodes:
                (seq,) = episode_sequences(e)
                ids = torch.tensor([seq.ids])
                mask = torch.tensor(seq.loss_mask[1:], dtype=torch.bool)
                total, count = (
                    total + float(token_logprobs(model(ids).logits, ids)[1][0][mask].sum()),
                    count + int(mask.sum()),
                )
        return total / count

    after = {}
    # a small step: near the untrained model's maximal entropy (7.57 of ln 2050 = 7.63 nats) a large one lowers it
    # whichever way the gradient points (the second-order term), and the test would read the sample, not the sign
    for coef in (-1.0, 0.0, 1.0):
        trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(lr=1e-4, entropy_coef=coef))
        trainer.rl_step(groups)
        after[coef] = entropy(trainer.model)
    assert after[-1.0] < after[0.0] < after[1.0], after


def test_lora_is_the_default_above_50m_parameters_only():
    small, large = build_tiny()[0], torch.nn.Linear(8_000, 8_000)  # 3.4 M, 64 M parameters
    assert lora_for(small) is None and lora_for(large) == LoraConfig()
    assert lora_for(small, True, LoraConfig(r=4)).r == 4 and lora_for(large, False) is None
    assert lora_for(small, "auto", LoraConfig(r=4)).r == 4  # a job config's explicit rl.train.lora is kept


def test_sft_weighs_the_tokens_naming_a_called_tool_and_reports_their_probability(fresh_policy):
    from harnessrl.train.losses import token_logprobs
    from harnessrl.train.sft import demonstration

    tok = fresh_policy.tokenizer
    reply = '<tool_call>{"name": "search_notes", "arguments": {"query": "tide at Olmar"}}</tool_call>'
    demo = demonstration(tok, [{"role": "user", "content": "What is the tide at Olmar?"}], reply)
    (seq,) = episode_sequences(demo, names=partial(name_tokens, tok))
    assert tok.decode([i for i, n in zip(seq.ids, seq.names) if n]) == "search_notes"
    with torch.no_grad():
        logp = token_logprobs(fresh_policy.model(torch.tensor([seq.ids])).logits, torch.tensor([seq.ids]))[0][0]
    loss, names = torch.tensor(seq.loss_mask[1:]).bool(), torch.tensor(seq.names[1:]).bool()
    for weight in (1.0, 10.0):
        trainer = Trainer(copy.deepcopy(fresh_policy.model), tok, TrainConfig(name_weight=weight))
        metrics = trainer.sft_step([demo])
        w = 1 + (weight - 1) * names.float()  # the name tokens count `weight` times, over the plain count, by hand
        assert metrics["loss/sft"] == pytest.approx(float((-logp * w)[loss].sum() / loss.sum()), rel=1e-4)
        assert metrics["sft/name_p"] == pytest.approx(float(logp[names].exp().mean()), rel=1e-4)


def test_each_schedule_warms_up_then_holds_or_decays_to_zero_at_total_steps():
    def factors(schedule: str) -> list[float]:
        factor = _lr_factor(TrainConfig(schedule=schedule, warmup_steps=2, total_steps=12))
        return [round(factor(step), 4) for step in range(13)]

    warm = [0.5, 1.0]  # then 10 steps of progress 0, 0.1, ..., 1.0
    assert factors("constant") == warm + [1.0] * 11
    assert factors("linear") == warm + [round(1 - p / 10, 4) for p in range(11)]
    assert factors("cosine")[2:] == [round(0.5 * (1 + math.cos(math.pi * p / 10)), 4) for p in range(11)]
    assert factors("wsd") == warm + [1.0] * 9 + [0.5, 0.0]  # held to progress 0.8, then linear to 0 at 1.0


def test_forget_after_keeps_the_steps_up_to_a_checkpoint_and_no_empty_log(fresh_policy, tmp_path):
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(), run_dir=tmp_path)
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')  # a kill cut the last line short
    trainer.forget_after(1)
    assert log.read_text() == '{"step": 1}\n'
    trainer.forget_after(0)  # killed before the first checkpoint: no log, which `report` reads as no update yet
    assert not log.exists()
    # RL's updates 1-3, the third skipped (every group tied: the step stays 2), saved at update 2: the job keeps 2
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 2, "perf/skipped_update": 1}\n')
    trainer.forget_after(2, lines=2)
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n'


FORGET_ON_A_FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path
    from types import SimpleNamespace
    from harnessrl.train.trainer import Trainer

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit raises instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # the disk fills while the log is rewritten
    try:
        Trainer.forget_after(SimpleNamespace(run_dir=Path(sys.argv[1])), 150)
    except OSError:
        sys.exit(27)
""")


def test_forget_after_on_a_full_disk_keeps_the_log_it_had(tmp_path):
    """It rewrote metrics.jsonl in place: a kill or a full disk while it wrote cost the run its history."""
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(f'{{"step": {step}, "loss/sft": 0.123456789}}\n' for step in range(1, 201)))
    run = subprocess.run([sys.executable, "-c", FORGET_ON_A_FULL_DISK, str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 27, run.stderr
    assert len(log.read_text().splitlines()) == 200


def test_adam_betas_and_a_warmup_past_the_schedule_are_refused_naming_the_fields():
    for bad in [(0.9, 1.5), (-1.0, 0.999)]:
        with pytest.raises(ValidationError, match="betas"):
            TrainConfig(betas=bad)
    with pytest.raises(ValidationError, match=r"warmup_steps \(50\) must be below total_steps \(40\)"):
        TrainConfig(schedule="cosine", warmup_steps=50, total_steps=40)
    TrainConfig(schedule="constant", warmup_steps=50, total_steps=40)  # no decay: the warm-up only


def test_a_group_with_a_non_finite_reward_is_left_out_whatever_its_order(fresh_policy):
    """[nan, 1.0] and [1.0, nan] alike: a failed reward, not an informative or a tied group."""
    groups = sampled_groups(fresh_policy, groups=3)
    groups[0][0].reward.total = math.nan
    groups[1][-1].reward.total = math.inf
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, policy=fresh_policy)
    assert not trainer.informative(groups[0]) and not trainer.informative(groups[1])
    metrics = trainer.rl_step(groups)
    assert metrics["rollout/groups_dropped_reward_failed"] == 2 and metrics["rollout/sequences"] == 4
    assert all(torch.isfinite(p).all() for p in fresh_policy.model.parameters())


def test_an_update_whose_loss_is_not_finite_is_skipped_and_pushes_nothing(fresh_policy, tmp_path):
    groups = sampled_groups(fresh_policy)
    groups[0][0].calls[0].sampled_logprobs[0] = math.nan  # e.g. a sampler's NaN logprob: a NaN ratio, loss, gradient
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, run_dir=tmp_path, policy=fresh_policy)
    before = {k: v.clone() for k, v in fresh_policy.model.state_dict().items()}
    skipped = trainer.rl_step(groups)
    assert skipped["perf/skipped_update"] == 1 and skipped["optim/nonfinite_steps"] == 1
    assert trainer.step == 0 and fresh_policy.version == 0
    assert all(torch.equal(v, before[k]) for k, v in fresh_policy.model.state_dict().items())
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    # one step of several: the others still train and push
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, TrainConfig(mini_batches=2), policy=fresh_policy)
    partial_ = trainer.rl_step(groups)
    assert partial_["optim/nonfinite_steps"] == 1 and partial_["optim/steps"] == 1 and fresh_policy.version == 1
    assert all(torch.isfinite(p).all() for p in fresh_policy.model.parameters())
    logged = [v for k, v in partial_.items() if k.startswith(("loss/", "policy/")) and isinstance(v, float)]
    assert logged and all(math.isfinite(v) for v in logged)  # the step it took, not the skipped one's NaN


def test_decoupled_kl_bias_correction_weights_the_kl_by_pi_over_the_behaviour_policy(fresh_policy):
    """Decoupled mode's ratio is pi / pi_prox: the KL's correction also needs the (truncated) pi_prox / pi_behaviour."""
    from harnessrl.train.losses import token_logprobs

    groups = sampled_groups(fresh_policy)
    config = TrainConfig(lr=3e-2, off_policy="decoupled", kl="k3", kl_coef=0.1, kl_bias_correction=True)
    trainer = Trainer(fresh_policy.model, fresh_policy.tokenizer, config)
    trainer.rl_step(groups)  # pi moves away from the reference (= the behaviour policy)
    prox = copy.deepcopy(trainer.model)
    metrics = trainer.rl_step(groups)  # on its first optimizer step pi = pi_prox
    weighted, plain, count = 0.0, 0.0, 0
    with torch.no_grad():
        for e in (e for g in groups for e in g):
            (seq,) = episode_sequences(e)
            ids = torch.tensor([seq.ids])
            logp = token_logprobs(prox(ids).logits, ids)[0][0]
            ref = token_logprobs(trainer.reference(ids).logits, ids)[0][0]
            k3 = torch.exp(ref - logp) + logp - ref - 1
            weight = torch.exp(logp - torch.tensor(seq.sampled_logprobs[1:])).clamp(max=config.is_cap)
            mask = torch.tensor(seq.loss_mask[1:], dtype=torch.bool)
            weighted, plain = weighted + float((k3 * weight)[mask].sum()), plain + float(k3[mask].sum())
            count += int(mask.sum())
    assert metrics["policy/kl"] == pytest.approx(weighted / count, rel=1e-3)
    assert abs(plain - weighted) / count > 1e-2 * metrics["policy/kl"]  # the test tells the two apart


def test_kl_bias_correction_without_a_kl_is_refused_naming_both_keys():
    with pytest.raises(ValueError, match="kl_bias_correction.*kl: none"):
        TrainConfig(kl_bias_correction=True)


def test_a_rescheduled_trainer_saves_and_resumes_its_new_schedule_without_a_warning(fresh_policy, tmp_path, caplog):
    config = TrainConfig(lr=1e-3, schedule="cosine", total_steps=100, warmup_steps=2)
    first = Trainer(fresh_policy.model, fresh_policy.tokenizer, config)
    for _ in range(4):
        first.scheduler.step()
    first.step = 4
    first.reschedule(10)
    assert first.optimizer.param_groups[0]["lr"] == pytest.approx(
        1e-3 * _lr_factor(config.model_copy(update={"total_steps": 10}))(4)
    )
    path = first.save(tmp_path / "checkpoints")
    again = Trainer(fresh_policy.model, fresh_policy.tokenizer, config.model_copy(update={"total_steps": 10}))
    again.resume(path)
    assert "resume:" not in caplog.text  # the checkpoint's schedule is the one this config asks
    rates = []
    for _ in range(6):
        rates.append(again.optimizer.param_groups[0]["lr"])
        again.scheduler.step()
    planned = _lr_factor(config.model_copy(update={"total_steps": 10}))
    assert (
        rates == pytest.approx([1e-3 * planned(s) for s in range(4, 10)])
        and rates[-1] > 0 == again.optimizer.param_groups[0]["lr"]
    )
