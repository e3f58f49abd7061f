"""Trainer steps on agent-shaped episodes: the vocabulary projection on the loss positions only
(`train/batches.py: tail_logprobs`, the trainer's path) against projecting every tail position (the
trainer's path until 2026-12-03: `tail_logits` + `losses.token_logprobs`), same batches, same model.

    python benchmarks/loss_positions.py [--model tiny-base] [--rounds 3] [--episodes 16] [--turns 4]
                                        [--prompt 300] [--completion 25] [--observation 110]

Each episode is a multi-turn agent conversation as the gateway records it: a prompt, then `turns`
completions (sampled tokens, the loss) each followed by a tool result (no loss), so one merged
sequence per episode; the defaults are shaped like the search main job's (prompt ~300 tokens, 14 %
of the tokens carry loss; the job's SFT 11 %, its RL 15 %). Both variants run `Trainer.sft_step` on
the episodes and `Trainer.rl_step` on them as 4 groups (PPO-clip, entropy term on), alternating,
fp32; medians are reported.
The last line is one JSON object: {"sft_speedup": X, "rl_speedup": Y, "loss_share": S, ...}.
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

import harnessrl.train.trainer as trainer_module
from harnessrl.argtypes import at_least
from harnessrl.policy import Policy
from harnessrl.train import TrainConfig, Trainer
from harnessrl.train.batches import tail_logits, tail_logprobs
from harnessrl.train.losses import token_logprobs
from harnessrl.types import Call, Episode, RewardBreakdown, Task


def every_position(model, mb, sampled=False, with_entropy_grad=False, vocab=None):
    """The baseline: project and log-softmax every tail position, then read the loss positions."""
    sampling = (mb.temperature, mb.top_p) if sampled else ()
    logits = tail_logits(model, mb)  # (B, T, V)
    if sampled:  # ids from `vocab` on (embedding rows no token maps to) get no probability, as in `tail_logprobs`
        logits = logits[..., :vocab]
    return token_logprobs(logits, mb.ids, *sampling, with_entropy_grad=with_entropy_grad)


def episodes(n: int, turns: int, prompt: int, completion: int, observation: int, vocab: int) -> list[Episode]:
    rng = random.Random(0)

    def draw(k: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(k)]

    out = []
    for i in range(n):
        ids, calls = draw(prompt), []
        for _ in range(turns):
            done = draw(completion)
            calls.append(
                Call(prompt_ids=ids, completion_ids=done, sampled_logprobs=[-1.5] * completion, policy_version=0)
            )
            ids = ids + done + draw(observation)
        reward = RewardBreakdown(total=rng.random())
        out.append(Episode(task=Task(id=f"t{i % 4}"), calls=calls, reward=reward, status="finished"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny-base")
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--episodes", type=at_least(4), default=16)
    parser.add_argument("--turns", type=at_least(1), default=4)
    parser.add_argument("--prompt", type=at_least(1), default=300)
    parser.add_argument("--completion", type=at_least(1), default=25)
    parser.add_argument("--observation", type=at_least(0), default=110)
    args = parser.parse_args()

    policy = Policy.load(args.model)
    batch = episodes(
        args.episodes, args.turns, args.prompt, args.completion, args.observation, len(policy.tokenizer)
    )  # fmt: skip
    groups = [[e for e in batch if e.task.id == f"t{g}"] for g in range(4)]
    tokens = sum(len(e.calls[-1].prompt_ids) + len(e.calls[-1].completion_ids) for e in batch)
    loss_tokens = args.episodes * args.turns * args.completion
    variants = {"ours": tail_logprobs, "all_positions": every_position}
    seconds: dict[str, list[float]] = {f"{kind}_{name}": [] for kind in ("sft", "rl") for name in variants}
    with tempfile.TemporaryDirectory() as run:
        config = TrainConfig(precision="fp32", lr=1e-6, entropy_coef=-0.1)
        trainer = Trainer(policy.model, policy.tokenizer, config, run_dir=Path(run), policy=policy)
        try:
            for round_ in range(args.rounds + 1):  # round 0 warms up
                for name, score in variants.items():
                    trainer_module.tail_logprobs = score
                    for kind, step in (
                        ("sft", lambda: trainer.sft_step(batch)),
                        ("rl", lambda: trainer.rl_step(groups)),
                    ):
                        start = time.perf_counter()
                        step()
                        if round_:
                            seconds[f"{kind}_{name}"].append(time.perf_counter() - start)
                if round_:
                    print("   ".join(f"{key} {values[-1]:.2f} s" for key, values in seconds.items()), flush=True)
        finally:
            trainer_module.tail_logprobs = tail_logprobs
    policy.close()
    median = {key: statistics.median(values) for key, values in seconds.items()}
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} "
        f"threads); model {args.model} (vocabulary {len(policy.tokenizer)}); {args.episodes} episodes of "
        f"{tokens // args.episodes} tokens, {loss_tokens / tokens:.0%} loss tokens; "
        f"seconds per step, median of {args.rounds}"
    )
    print(json.dumps({
        "sft_speedup": round(median["sft_all_positions"] / median["sft_ours"], 3),
        "rl_speedup": round(median["rl_all_positions"] / median["rl_ours"], 3),
        "loss_share": round(loss_tokens / tokens, 3),
        **{f"{key}_s": round(value, 3) for key, value in median.items()},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
