"""A real model on the CPU: the engine against transformers' `generate`, the trainer against a bare loop.

    python benchmarks/real_model.py [--model smollm2-135m-instruct] [--requests 32] [--max-tokens 64]
                                    [--steps 2] [--groups 4] [--group-size 4] [--prompt 64] [--completion 64]

Measured in one run, on SmolLM2-135M-Instruct (fp32; 30 layers, 49k vocabulary) unless --model says:
  engine        32 chat requests sent at once to the engine (continuous batching, KV cache), greedy,
                each until its end-of-turn token or --max-tokens: rows that finish leave the batch
  hf_generate   the same prompts as one left-padded batch through `model.generate` (greedy, same
                limit), the way a script without an engine batches them: finished rows ride along
                until the longest is done; tokens counted up to each row's end-of-turn token
  *_fixed       both again with every reply exactly --max-tokens long (ignore_eos / min_new_tokens):
                the same work on both sides, so only the per-step cost differs
  trainer       Trainer.rl_step with LoRA (the default for this model: r 16 on every projection) on
                random-id episodes: advantages, masks, micro-batches, PPO-clip loss and its statistics,
                AdamW, clipping, merged weights pushed to the live policy
  torch         the same padded batch through the same peft LoRA model: forward, masked policy-gradient
                loss, backward, AdamW step
engine_vs_hf_generate = engine tok/s / hf_generate tok/s (useful generated tokens); trainer_vs_torch likewise
for training tokens/s (prompt + completion, unpadded). Generation is timed once each (minutes on 2
cores); training alternates trainer and torch for --steps rounds after a warm-up, medians reported.
The last line is one JSON object: {"engine_vs_hf_generate": X, "trainer_vs_torch": Y, "gen_tok_s": A,
"train_tok_s": B, "engine_vs_hf_generate_fixed": ..., ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import peft
import torch

sys.path.insert(0, str(Path(__file__).parent))
from generation import _requests  # noqa: E402
from train_throughput import _bare_step, _groups, alternate  # noqa: E402

from harnessrl.argtypes import at_least  # noqa: E402
from harnessrl.policy import Policy, SamplingParams  # noqa: E402
from harnessrl.policy.model import load_model_and_tokenizer  # noqa: E402
from harnessrl.train import LoraConfig, TrainConfig, Trainer  # noqa: E402


async def _engine(policy: Policy, prompts: list[list[int]], max_tokens: int, fixed: bool) -> tuple[float, int]:
    params = [SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=fixed) for _ in prompts]
    start = time.perf_counter()
    done = await asyncio.gather(*(policy.engine.generate(p, s) for p, s in zip(prompts, params)))
    return time.perf_counter() - start, sum(len(c[0].ids) for c in done)


def _hf_generate(policy: Policy, prompts: list[list[int]], max_tokens: int, fixed: bool) -> tuple[float, int]:
    width = max(len(p) for p in prompts)
    pad = policy.tokenizer.pad_token_id or 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.inference_mode():
        out = policy.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens if fixed else 0,
            do_sample=False, pad_token_id=pad, eos_token_id=sorted(policy.eos_ids),
        )  # fmt: skip
    seconds, made = time.perf_counter() - start, 0
    for row in out[:, width:].tolist():
        ends = [i for i, t in enumerate(row) if t in policy.eos_ids]
        made += len(row) if fixed or not ends else ends[0] + 1
    return seconds, made


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=at_least(1), default=32)
    parser.add_argument("--max-tokens", type=at_least(1), default=64)
    parser.add_argument("--steps", type=at_least(1), default=2)
    parser.add_argument("--groups", type=at_least(1), default=4)
    parser.add_argument("--group-size", type=at_least(1), default=4)
    parser.add_argument("--prompt", type=at_least(1), default=64)
    parser.add_argument("--completion", type=at_least(1), default=64)
    args = parser.parse_args()

    policy = Policy.load(args.model, max_batch=args.requests)
    prompts = [policy.encode(policy.render(c, None, generation_prompt=True)) for c in _requests(args.requests)]
    gen = {}
    for fixed in (False, True):
        for name in ("engine", "hf_generate"):
            if name == "engine":
                seconds, made = asyncio.run(_engine(policy, prompts, args.max_tokens, fixed))
            else:
                seconds, made = _hf_generate(policy, prompts, args.max_tokens, fixed)
            key = name + ("_fixed" if fixed else "")
            gen[key] = made / seconds
            print(f"{key:18} {gen[key]:7.1f} tok/s ({made} tokens, {seconds:.1f} s)")

    groups = _groups(args.groups, args.group_size, args.prompt, args.completion, len(policy.tokenizer))
    tokens = sum(len(c.prompt_ids) + len(c.completion_ids) for g in groups for e in g for c in e.calls)
    lora = LoraConfig()
    with tempfile.TemporaryDirectory() as run:
        config = TrainConfig(precision="fp32", lora=lora)
        trainer = Trainer(policy.model, policy.tokenizer, config, run_dir=Path(run), policy=policy)
        bare = peft.get_peft_model(
            load_model_and_tokenizer(args.model)[0].train(),
            peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=lora.target_modules),
        )
        optimizer = torch.optim.AdamW([p for p in bare.parameters() if p.requires_grad], lr=1e-4)
        seqs = [e.calls[0].prompt_ids + e.calls[0].completion_ids for g in groups for e in g]
        ids = torch.tensor(seqs)
        mask = torch.tensor([[0] * args.prompt + [1] * args.completion for _ in seqs])[:, 1:].float()
        adv = torch.randn(len(seqs), 1)
        steps = {
            "trainer": lambda: trainer.rl_step(groups),
            "torch": lambda: _bare_step(bare, optimizer, ids, mask, adv),
        }
        train = alternate(steps, args.steps, tokens, ",.1f")
    policy.close()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads); "
        f"{args.model}: {args.requests} requests x {args.max_tokens} tokens; training {len(seqs)} sequences x "
        f"{args.prompt + args.completion} tokens per step, LoRA r {lora.r}, fp32"
    )
    print(json.dumps({
        "engine_vs_hf_generate": round(gen["engine"] / gen["hf_generate"], 3),
        "trainer_vs_torch": round(train["trainer"] / train["torch"], 3),
        "gen_tok_s": round(gen["engine"], 1),
        "train_tok_s": round(train["trainer"], 1),
        "hf_generate_tok_s": round(gen["hf_generate"], 1),
        "torch_tok_s": round(train["torch"], 1),
        "engine_vs_hf_generate_fixed": round(gen["engine_fixed"] / gen["hf_generate_fixed"], 3),
        "gen_fixed_tok_s": round(gen["engine_fixed"], 1),
        "hf_generate_fixed_tok_s": round(gen["hf_generate_fixed"], 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
