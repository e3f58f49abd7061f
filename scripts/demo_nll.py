"""How well each base predicts a job's demonstrations before any SFT: the mean negative log-likelihood (nats a token)
of their trained tokens, teacher-forced. A cheap first reading of what the search job's warm start has to learn from
a base, which the probe's short items do not measure (tiny-base's card, 2026-12-07).

    python scripts/demo_nll.py RUN/demos.jsonl tiny-base tiny-base-long runs/some-export [--limit 60]

One line a model; the last line is one JSON object {model: nats a token}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from harnessrl.policy import Policy
from harnessrl.train.batches import micro_batch, tail_logprobs
from harnessrl.train.sequences import episode_sequences
from harnessrl.train.sft import read_episodes


def demo_nll(policy: Policy, episodes) -> tuple[float, int]:
    """(mean NLL of the episodes' loss tokens, how many tokens)."""
    total = count = 0.0
    with torch.no_grad():
        for episode in episodes:
            for seq in episode_sequences(episode, 1.0):
                mb = micro_batch([seq])
                logp, _ = tail_logprobs(policy.model, mb)
                total -= float((logp * mb.mask).sum())
                count += float(mb.mask.sum())
    return total / max(count, 1.0), int(count)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("demos", type=Path, help="a run's demos.jsonl")
    parser.add_argument("models", nargs="+", help="what --model takes: tiny-base, a folder, ...")
    parser.add_argument("--limit", type=int, default=60, help="the first N demonstrations")
    args = parser.parse_args(argv)
    episodes = read_episodes(args.demos)[: args.limit]
    out = {}
    for model in args.models:
        out[model], tokens = demo_nll(Policy.load(model), episodes)
        print(f"{model}: {out[model]:.3f} nats a token over {tokens} tokens of {len(episodes)} demonstrations")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
