"""Does a base take another lookup when the question's chain asks for one? On the probe's `record_chain` items, the
share of replies that call the lookup tool (right name or not), split by what the item asks: `hop` (the next lookup
is right) and `answer` (the value, or passing it on, is). A base that answers from whatever records it was shown
scores low on `hop` (tiny-base's card, "A chain of lookups").

    python scripts/chain_hops.py tiny-base tiny-base-long runs/some-export [--items 120]

One line a model; the last line is one JSON object {model: {"hop": share, "answer": share, "items": {...}}}.
"""

from __future__ import annotations

import argparse
import json

from harnessrl.eval.probe import _answers
from harnessrl.policy import Policy
from harnessrl.policy.mixture import Mixture


def lookup_shares(policy: Policy, items) -> dict:
    """Per kind of item: the share of replies that call the item's lookup tool (its first tool)."""
    called: dict[str, list[bool]] = {"hop": [], "answer": []}
    for item, reply in zip(items, _answers(policy, items)):
        lookup = item.tools[0]["function"]["name"]
        hop = isinstance(item.expected_call, dict) and item.expected_call["name"] == lookup
        called["hop" if hop else "answer"].append(f'"name": "{lookup}"' in reply)
    return {kind: sum(c) / max(len(c), 1) for kind, c in called.items()} | {
        "items": {k: len(c) for k, c in called.items()}
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="what --model takes: tiny-base, a folder, ...")
    parser.add_argument("--items", type=int, default=120, help="record_chain items (the probe's seed)")
    parser.add_argument("--seed", type=int, default=1_000_003, help="seed of the items (the probe's default)")
    args = parser.parse_args(argv)
    mixture = Mixture(args.seed)
    items = [mixture.item("record_chain") for _ in range(args.items)]
    out = {}
    for model in args.models:
        policy = Policy.load(model)
        try:
            out[model] = lookup_shares(policy, items)
        finally:
            policy.close()
        print(
            f"{model}: calls the lookup on {out[model]['hop']:.2f} of hop items, {out[model]['answer']:.2f} of answer items"
        )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
