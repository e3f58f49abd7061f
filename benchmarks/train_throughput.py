"""Trainer throughput against a bare PyTorch loop on the same batches.

    python benchmarks/train_throughput.py [--steps 5] [--groups 8] [--group-size 4] [--prompt 128] [--completion 128]

Both train the tiny model on the same episodes (random ids, one call each, random rewards):
  trainer  Trainer.rl_step: advantages, sequences, masks, micro-batches, PPO-clip loss with its
           statistics, AdamW, grad clipping, weight push to a live policy, metrics line
  torch    the same padded batch: forward, masked policy-gradient loss, backward, AdamW step
  bf16     the trainer again under bf16 autocast (precision: bf16), to show what `precision: auto` decides:
           on a CPU with AVX-512 BF16 / AMX it is faster than fp32, on an AVX2-only CPU many times slower
tokens/s counts real (unpadded) tokens; rounds alternate between them; medians are reported.
The last line is one JSON object: {"trainer_vs_torch": X, "fp32_tok_s": A, "bf16_tok_s": B, "bf16_over_fp32": B / A,
"auto_precision": "bf16" | "fp32", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from harnessrl.argtypes import at_least
from harnessrl.policy import Policy
from harnessrl.policy.tiny import build_tiny
from harnessrl.train import TrainConfig, Trainer
from harnessrl.train.precision import resolve
from harnessrl.types import Call, Episode, RewardBreakdown, Task


def _groups(groups: int, size: int, prompt: int, completion: int, vocab: int) -> list[list[Episode]]:
    rng = random.Random(0)
    out = []
    for g in range(groups):
        ids = [rng.randrange(vocab) for _ in range(prompt)]
        group = []
        for _ in range(size):
            done = [rng.randrange(vocab) for _ in range(completion)]
            call = Call(prompt_ids=ids, completion_ids=done, sampled_logprobs=[-7.6] * completion, policy_version=0)
            group.append(Episode(task=Task(id=f"t{g}"), calls=[call], reward=RewardBreakdown(total=rng.random())))
        out.append(group)
    return out


def _bare_step(model, optimizer, ids: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor) -> None:
    logits = model(input_ids=ids).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -(logp * adv * mask).sum() / mask.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def alternate(steps: dict, rounds: int, tokens: int, spec: str = ",.0f") -> dict[str, float]:
    """Median tokens/s of each step function: one warm-up call each, then `rounds` rounds that call them in turn."""
    for step in steps.values():
        step()
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            rates[name].append(tokens / (time.perf_counter() - start))
        print("   ".join(f"{name} {r[-1]:{spec}} tok/s" for name, r in rates.items()))
    return {name: statistics.median(r) for name, r in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=at_least(1), default=5)
    parser.add_argument("--groups", type=at_least(1), default=8)
    parser.add_argument("--group-size", type=at_least(1), default=4)
    parser.add_argument("--prompt", type=at_least(1), default=128)
    parser.add_argument("--completion", type=at_least(1), default=128)
    args = parser.parse_args()

    policy = Policy.load("tiny")
    groups = _groups(args.groups, args.group_size, args.prompt, args.completion, len(policy.tokenizer))
    tokens = sum(len(c.prompt_ids) + len(c.completion_ids) for g in groups for e in g for c in e.calls)
    with tempfile.TemporaryDirectory() as run:
        trainer = Trainer(
            policy.model, policy.tokenizer, TrainConfig(precision="fp32"), run_dir=Path(run), policy=policy
        )
        bf16 = Trainer(policy.model, policy.tokenizer, TrainConfig(precision="bf16"), run_dir=Path(run), policy=policy)
        bare, _ = build_tiny()
        bare.train()
        optimizer = torch.optim.AdamW(bare.parameters(), lr=1e-4)
        seqs = [e.calls[0].prompt_ids + e.calls[0].completion_ids for g in groups for e in g]
        ids = torch.tensor(seqs)
        mask = torch.tensor([[0] * args.prompt + [1] * args.completion for _ in seqs])[:, 1:].float()
        adv = torch.randn(len(seqs), 1)

        steps = {
            "trainer": lambda: trainer.rl_step(groups),
            "torch": lambda: _bare_step(bare, optimizer, ids, mask, adv),
            "bf16": lambda: bf16.rl_step(groups),
        }
        tok_s = alternate(steps, args.steps, tokens)
    policy.close()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads); "
        f"{len(seqs)} sequences x {args.prompt + args.completion} tokens per step, tiny model; {resolve('auto')[1]}"
    )
    print(json.dumps({
        "trainer_vs_torch": round(tok_s["trainer"] / tok_s["torch"], 3),
        "trainer_tok_s": round(tok_s["trainer"]),
        "torch_tok_s": round(tok_s["torch"]),
        "fp32_tok_s": round(tok_s["trainer"]),
        "bf16_tok_s": round(tok_s["bf16"]),
        "bf16_over_fp32": round(tok_s["bf16"] / tok_s["trainer"], 3),
        "auto_precision": resolve("auto")[0],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
