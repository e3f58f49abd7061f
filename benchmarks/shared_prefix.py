"""SFT steps on distinct tasks that begin with one system prompt: the prefix every row of a micro-batch
shares run once (`train/batches.py: _shared_cuts`, the trainer's path) against one plain forward of
every whole row (the trainer's path until 2026-12-03 wherever rows did not share their whole prompt),
same batches, same model.

    python benchmarks/shared_prefix.py [--model tiny-base] [--rounds 3] [--episodes 16]

Two shapes, each an agent conversation as the gateway records it (a shared system prompt with the
tool schemas, a task-specific prompt, then completions, the loss, each followed by a tool result):
`search`, like the search main job's demonstrations (a 230-token shared head of 260-token prompts, 3
turns: 676-token sequences, 14 % loss tokens; the job's: median 798, 12 %), and `swarm`, like the swarm
job's orchestrator demonstrations (334 of ~480 prompt tokens shared, a long assignment reply, its
observation and the answer: 1,124 tokens, 39 % loss; the job's: median 1,039, 40 %).
`Trainer.sft_step` on the episodes, fp32, alternating the variants; medians. The last line is one JSON object: {"sft_speedup_search": X, "sft_speedup_swarm": Y, ...}.
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

import harnessrl.train.batches as batches
from harnessrl.argtypes import at_least
from harnessrl.policy import Policy
from harnessrl.train import TrainConfig, Trainer
from harnessrl.types import Call, Episode, Task

# (shared head, distinct prompt, [(completion, observation), ...]) in tokens
SHAPES = {
    "search": (230, 30, [(32, 160), (32, 160), (32, 120)]),
    "swarm": (334, 150, [(380, 200), (60, 0)]),
}


def episodes(n: int, shape: str, vocab: int) -> list[Episode]:
    rng = random.Random(0)
    head, prompt, turns = SHAPES[shape]

    def draw(k: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(k)]

    system = draw(head)
    out = []
    for i in range(n):
        ids, calls = system + draw(prompt), []
        for completion, observation in turns:
            done = draw(completion)
            calls.append(
                Call(prompt_ids=ids, completion_ids=done, sampled_logprobs=[-1.5] * completion, policy_version=0)
            )
            ids = ids + done + draw(observation)
        out.append(Episode(task=Task(id=f"t{i}"), calls=calls, status="finished"))
    return out


def plain(batch):
    return [0] * len(batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny-base")
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--episodes", type=at_least(1), default=16)
    args = parser.parse_args()

    policy = Policy.load(args.model)
    data = {shape: episodes(args.episodes, shape, len(policy.tokenizer)) for shape in SHAPES}
    variants = {"ours": batches._shared_cuts, "plain": plain}
    seconds: dict[str, list[float]] = {f"{shape}_{name}": [] for shape in SHAPES for name in variants}
    with tempfile.TemporaryDirectory() as run:
        trainer = Trainer(policy.model, policy.tokenizer, TrainConfig(precision="fp32", lr=1e-6), run_dir=Path(run))
        try:
            for round_ in range(args.rounds + 1):  # round 0 warms up
                for shape, batch in data.items():
                    for name, cuts in variants.items():
                        batches._shared_cuts = cuts
                        start = time.perf_counter()
                        trainer.sft_step(batch)
                        if round_:
                            seconds[f"{shape}_{name}"].append(time.perf_counter() - start)
                if round_:
                    print("   ".join(f"{key} {values[-1]:.2f} s" for key, values in seconds.items()), flush=True)
        finally:
            batches._shared_cuts = variants["ours"]
    policy.close()
    median = {key: statistics.median(values) for key, values in seconds.items()}
    sizes = {shape: sum(len(e.calls[-1].prompt_ids) + len(e.calls[-1].completion_ids) for e in b) // len(b)
             for shape, b in data.items()}  # fmt: skip
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} "
        f"threads); model {args.model}; {args.episodes} episodes a step, tokens each {sizes}; "
        f"seconds per step, median of {args.rounds}"
    )
    print(json.dumps({
        **{f"sft_speedup_{shape}": round(median[f"{shape}_plain"] / median[f"{shape}_ours"], 3) for shape in SHAPES},
        **{f"{key}_s": round(value, 3) for key, value in median.items()},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
