"""Copying / tool-use probe: fresh generated items per skill, answered greedily, scored exactly.

A text answer counts when the reply (special tokens dropped, whitespace trimmed) equals the expected
value; a tool answer counts when the reply holds one `<tool_call>` whose JSON has the expected name
and arguments.
"""

from __future__ import annotations

import asyncio
import json

from harnessrl.gateway.toolcalls import BLOCK
from harnessrl.policy import Policy, SamplingParams
from harnessrl.policy.mixture import SKILLS, Item, Mixture, render_item


def score(item: Item, reply: str) -> bool:
    if item.expected_call is None:
        return reply.strip() == item.answer
    calls = BLOCK.findall(reply)
    try:
        return len(calls) == 1 and json.loads(calls[0]) == item.expected_call
    except json.JSONDecodeError:
        return False


def probe(policy: Policy, items_per_skill: int = 100, seed: int = 1_000_003) -> dict[str, float]:
    """Accuracy per skill on `items_per_skill` fresh items (generated from `seed`, never trained on)."""
    mixture = Mixture(seed)
    items = [mixture.item(skill) for skill in SKILLS for _ in range(items_per_skill)]

    async def answer(item: Item) -> str:
        prompt = policy.encode(render_item(policy.tokenizer, item, with_answer=False))
        budget = len(policy.encode(item.answer)) + 8
        (done,) = await policy.engine.generate(prompt, SamplingParams(temperature=0, max_tokens=budget))
        return policy.decode(done.ids, skip_special=True)

    async def run() -> list[str]:
        return await asyncio.gather(*(answer(item) for item in items))

    replies = asyncio.run(run())
    hits: dict[str, list[bool]] = {s: [] for s in SKILLS}
    for item, reply in zip(items, replies):
        hits[item.skill].append(score(item, reply))
    return {skill: sum(h) / len(h) for skill, h in hits.items()}
