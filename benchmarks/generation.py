"""Generation throughput: continuous batching vs one request at a time, and the gateway's overhead.

    python benchmarks/generation.py [--requests 32] [--max-tokens 64] [--repeats 5]

Same 32 seeded chat requests, the tiny model, every completion max_tokens long (ignore_eos), measured
in one run:
  sequential  the engine, one request at a time
  batched     the engine, all requests concurrently (they share forward passes)
  gateway     the same concurrent requests through the gateway over real HTTP on 127.0.0.1, each in its
              own recorded episode, sent as ready JSON bodies by a bare httpx client
  openai      the same through the official openai client (which spends its own CPU building and
              parsing pydantic objects, in this process, on these 2 cores: the agent's cost, not the
              gateway's, reported beside it)
batched_vs_sequential = batched tok/s / sequential tok/s; gateway_overhead = batched tok/s /
gateway tok/s - 1 (the gateway's HTTP, validation, templating, recording and response on top of the
engine); openai_client_overhead likewise for the openai path.
Mixed load (head-of-line blocking): 24 short requests (32 tokens each) start together, alone or with
one 3,000-token prompt arriving at the same moment; short_p99_ratio = p99 latency of the short
requests with the long prompt / without it (goal <= 2), long_prompt_seconds = the long request's own
latency. Measured with the engine's defaults (chunked prefill, held to about half a decode step's time
per step while rows decode: `prefill_share` 0.5), with the cap lifted (`_uncapped`, what the RL job
runs for throughput) and with chunking off (every admitted prompt prefilled together, padded to the
longest, as before: the baseline, `_unchunked`).
Medians over repeats. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time

import torch

from harnessrl.argtypes import at_least
from harnessrl.gateway import BackgroundServer, GatewayClient, create_app
from harnessrl.gateway.client import _http
from harnessrl.policy import Policy, SamplingParams

ADMIN = "bench-admin-key"


def _requests(n: int) -> list[list[dict]]:
    topics = ["the river", "a city", "the weather", "a book", "the market", "an old bridge", "the festival", "a garden"]
    return [[{"role": "system", "content": "You are a helpful assistant."},
             {"role": "user", "content": f"Tell me about {topics[i % 8]} number {i}, briefly."}] for i in range(n)]  # fmt: skip


async def _engine(policy: Policy, prompts: list[list[int]], max_tokens: int, concurrent: bool) -> tuple[float, int]:
    params = [SamplingParams(max_tokens=max_tokens, seed=i, ignore_eos=True) for i in range(len(prompts))]
    start = time.perf_counter()
    if concurrent:
        done = await asyncio.gather(*(policy.engine.generate(p, s) for p, s in zip(prompts, params)))
    else:
        done = [await policy.engine.generate(p, s) for p, s in zip(prompts, params)]
    return time.perf_counter() - start, sum(len(c[0].ids) for c in done)


async def _gateway(gateway: GatewayClient, conversations: list[list[dict]], max_tokens: int) -> tuple[float, int]:
    keys = [(await gateway.create_episode())[1] for _ in conversations]
    bodies = [
        json.dumps({"messages": m, "max_tokens": max_tokens, "seed": i, "ignore_eos": True}).encode()
        for i, m in enumerate(conversations)
    ]
    async with _http.AsyncClient(base_url=gateway.base_url, limits=_http.Limits(max_connections=256)) as http:
        await asyncio.gather(*(http.get("/health") for _ in bodies))  # open the connections, as running agents have
        start = time.perf_counter()
        responses = await asyncio.gather(*(
            http.post("/v1/chat/completions", content=b, headers={"Authorization": f"Bearer {k}", "Content-Type": "application/json"})
            for b, k in zip(bodies, keys)
        ))  # fmt: skip
        elapsed = time.perf_counter() - start
    return elapsed, sum(r.json()["usage"]["completion_tokens"] for r in responses)


async def _openai(gateway: GatewayClient, conversations: list[list[dict]], max_tokens: int) -> tuple[float, int]:
    keys = [(await gateway.create_episode())[1] for _ in conversations]
    clients = [gateway.openai(k) for k in keys]
    start = time.perf_counter()
    responses = await asyncio.gather(*(
        c.chat.completions.create(model="tiny", messages=m, max_tokens=max_tokens, seed=i, extra_body={"ignore_eos": True})
        for i, (c, m) in enumerate(zip(clients, conversations))
    ))  # fmt: skip
    elapsed = time.perf_counter() - start
    return elapsed, sum(r.usage.completion_tokens for r in responses)


async def _mixed(policy: Policy, shorts: list[list[int]], long: list[int] | None) -> tuple[list[float], float]:
    """Latencies of the short requests (and of the long one) when all start together."""
    params = SamplingParams(max_tokens=32, ignore_eos=True, seed=0)

    async def timed(prompt: list[int]) -> float:
        start = time.perf_counter()
        await policy.engine.generate(prompt, params)
        return time.perf_counter() - start

    latencies = await asyncio.gather(*(timed(p) for p in ([*shorts, long] if long else shorts)))
    return (list(latencies[: len(shorts)]), latencies[-1] if long else 0.0)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _mixed_load(policy: Policy, conversations: list[list[dict]], repeats: int) -> dict[str, float]:
    shorts = [policy.encode(policy.render(m, None, True)) for m in (conversations * 3)[:24]]
    long = policy.encode(policy.render([{"role": "user", "content": "one more word " * 1000}], None, True))[:3000]
    out = {}
    engine = policy.engine
    for label, chunk, share in (("", 512, engine.prefill_share), ("_uncapped", 512, None), ("_unchunked", 10**9, None)):
        saved = engine.prefill_chunk, engine.prefill_budget, engine.prefill_share
        engine.prefill_chunk, engine.prefill_budget, engine.prefill_share = chunk, max(chunk, saved[1]), share
        ratios, p50s, long_seconds = [], [], []
        for _ in range(repeats):
            alone, _ = await _mixed(policy, shorts, None)
            mixed, seconds = await _mixed(policy, shorts, long)
            ratios.append(_p(mixed, 0.99) / _p(alone, 0.99))
            p50s.append((_p(alone, 0.5), _p(mixed, 0.5), _p(alone, 0.99), _p(mixed, 0.99)))
            long_seconds.append(seconds)
        engine.prefill_chunk, engine.prefill_budget, engine.prefill_share = saved
        a50, m50, a99, m99 = (statistics.median(x) for x in zip(*p50s))
        print(f"mixed{label or ' (chunked)'}: short p50 {a50:.2f} -> {m50:.2f} s, p99 {a99:.2f} -> {m99:.2f} s "
              f"with a {len(long)}-token prompt, which took {statistics.median(long_seconds):.2f} s")  # fmt: skip
        out |= {
            f"short_p99_ratio{label}": round(statistics.median(ratios), 3),
            f"long_prompt_seconds{label}": round(statistics.median(long_seconds), 3),
            f"short_p50_seconds{label}": round(m50, 3),
            f"short_p99_seconds{label}": round(m99, 3),
        }
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=at_least(1), default=32)
    parser.add_argument("--max-tokens", type=at_least(1), default=64)
    parser.add_argument("--repeats", type=at_least(1), default=5)
    args = parser.parse_args()

    policy = Policy.load("tiny")
    conversations = _requests(args.requests)
    prompts = [policy.encode(policy.render(m, None, True)) for m in conversations]
    await _engine(policy, prompts[:4], 8, concurrent=True)  # warm up
    rates: dict[str, list[float]] = {"sequential": [], "batched": [], "gateway": [], "openai": []}
    with BackgroundServer(create_app(policy, ADMIN)) as server:
        gateway = GatewayClient(ADMIN, base_url=server.base_url)
        await _gateway(gateway, conversations[:4], 8)  # warm up
        await _openai(gateway, conversations[:4], 8)
        for _ in range(args.repeats):
            for name, run in (
                ("sequential", lambda: _engine(policy, prompts, args.max_tokens, concurrent=False)),
                ("batched", lambda: _engine(policy, prompts, args.max_tokens, concurrent=True)),
                ("gateway", lambda: _gateway(gateway, conversations, args.max_tokens)),
                ("openai", lambda: _openai(gateway, conversations, args.max_tokens)),
            ):
                seconds, tokens = await run()
                rates[name].append(tokens / seconds)
                print(f"{name:>10}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:,.0f} tok/s")
        await gateway.aclose()
    mixed = await _mixed_load(policy, conversations, args.repeats)
    policy.close()

    tok_s = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); {args.requests} requests x {args.max_tokens} tokens, tiny model"
    )
    print(json.dumps({
        "batched_vs_sequential": round(tok_s["batched"] / tok_s["sequential"], 2),
        "gateway_overhead": round(tok_s["batched"] / tok_s["gateway"] - 1, 4),
        "openai_client_overhead": round(tok_s["batched"] / tok_s["openai"] - 1, 4),
        "sequential_tok_s": round(tok_s["sequential"]),
        "batched_tok_s": round(tok_s["batched"]),
        "gateway_tok_s": round(tok_s["gateway"]),
        "openai_tok_s": round(tok_s["openai"]),
        **mixed,
    }))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
