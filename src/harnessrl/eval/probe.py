"""Copying / tool-use probe: fresh generated items per skill, answered greedily, scored exactly.

A text answer counts when the reply (special tokens dropped, whitespace trimmed) equals the expected
value; a tool answer counts when the reply holds the expected calls (one, or a `list_calls` batch in
order), in the policy's tool format, with the expected names and arguments. Prompts are rendered as the gateway renders them (`Policy.render`).
"""

from __future__ import annotations

import asyncio
import json

from harnessrl.gateway.toolcalls import parse_tool_calls
from harnessrl.policy import Policy, SamplingParams
from harnessrl.policy.mixture import SKILLS, Item, Mixture, with_history
from harnessrl.policy.toolformat import ToolFormat, name_tokens
from harnessrl.types import Episode


def score(item: Item, reply: str, fmt: ToolFormat | None = None) -> bool:
    if item.expected_call is None:
        return reply.strip() == item.answer
    parsed = parse_tool_calls(reply, {t["function"]["name"] for t in item.tools or ()}, fmt)
    expected = item.expected_call if isinstance(item.expected_call, list) else [item.expected_call]
    return [(n, json.loads(a)) for n, a in parsed.calls] == [(e["name"], e["arguments"]) for e in expected]


def probe(
    policy: Policy, items_per_skill: int = 100, seed: int = 1_000_003, temperature: float = 0.0
) -> dict[str, float]:
    """Accuracy per skill on `items_per_skill` fresh items (generated from `seed`, never trained on),
    answered greedily, or with one sample at `temperature` (what RL's rollouts draw)."""
    mixture = Mixture(seed)
    keyed = [(s, mixture.item(s)) for s in SKILLS for _ in range(items_per_skill)]
    return _accuracy(policy, keyed, temperature, seed)


def record_grid(
    policy: Policy, items: int = 40, seed: int = 1_000_003, fields=(1, 2, 4), records=(1, 3), temperature: float = 0.0
) -> dict[str, float]:
    """`record_field` accuracy by fields per record x records shown: with one record, picking the
    asked field is the whole skill, and 1 / fields is what a model that ignores the field word gets;
    with one field, picking the record by name is."""
    mixture, cells = Mixture(seed), []
    for f in fields:
        for r in records:
            mixture.fields, mixture.records = (f, f), (r, r)
            cells += [(f"fields={f} records={r}", mixture.item("record_field")) for _ in range(items)]
    return _accuracy(policy, cells, temperature, seed)


def context_grid(
    policy: Policy,
    items: int = 40,
    seed: int = 1_000_003,
    lengths=(0, 256, 512, 1024),
    skills=SKILLS,
    temperature: float = 0.0,
) -> dict[str, float]:
    """Each skill's accuracy behind an earlier conversation of at least `length` tokens (copy and recall
    exchanges with their answers, so names and values the item does not ask for): what a probe of
    short items cannot see of an agent's ~1,000-token contexts. The same items at every length."""
    cells = []
    for length in lengths:
        mixture, filler = Mixture(seed), Mixture(seed + 1)
        for skill in skills:
            cells += [
                (f"{skill} context={length}", _behind(policy, mixture.item(skill), filler, length))
                for _ in range(items)
            ]
    return _accuracy(policy, cells, temperature, seed)


def _behind(policy: Policy, item: Item, filler: Mixture, length: int) -> Item:
    """`item` behind earlier exchanges of at least `length` tokens."""
    history, tokens = [], 0
    while tokens < length:
        exchange = filler.exchange()
        tokens += len(policy.encode(policy.render(exchange, None, generation_prompt=False)))
        history += exchange
    return with_history(item, history)


def decisions(policy: Policy, episodes: list[Episode]) -> dict[str, dict[str, float]]:
    """How surely the model takes each recorded action: the probability it gives the tool name of each
    call's (first) tool call, all the name's tokens, teacher-forced on the recorded prompt; per
    "FAMILY call K NAME" (the task's `family`, or "all"; K counts the episode's calls from 1), the mean
    and the count, in name order. On an agent's own demonstrations, a choice the model has not learnt
    to make (a question word it does not read) sits near a coin flip while the SFT loss looks converged.
    NotThisTokenizer where an episode holds ids beyond the model's vocabulary (another model's episodes)."""
    import torch

    from harnessrl.eval.inspect import check_vocabulary
    from harnessrl.train.losses import token_logprobs

    rows = policy.model.get_input_embeddings().num_embeddings
    for episode in episodes:  # before any forward pass: such an id fails the embedding with an IndexError
        check_vocabulary(episode, policy.tokenizer, rows)
    found: dict[str, list[float]] = {}
    for episode in episodes:
        family = str(episode.task.data.get("family") or "all")
        for number, call in enumerate(episode.calls, 1):
            marks = name_tokens(policy.tokenizer, call.completion_ids)
            if 1 not in marks:
                continue
            first = marks.index(1)
            end = next((i for i in range(first, len(marks)) if not marks[i]), len(marks))
            ids = torch.tensor([call.prompt_ids + call.completion_ids], device=policy.model.device)
            with torch.no_grad():
                logp = token_logprobs(policy.model(ids).logits.float(), ids)[0][0, len(call.prompt_ids) - 1 :]
            name = policy.decode(call.completion_ids[first:end])
            found.setdefault(f"{family} call {number} {name}", []).append(float(logp[first:end].sum().exp()))
    return {key: {"p": sum(ps) / len(ps), "n": len(ps)} for key, ps in sorted(found.items())}


def _accuracy(
    policy: Policy, keyed: list[tuple[str, Item]], temperature: float = 0.0, seed: int = 0
) -> dict[str, float]:
    """Share of items answered exactly, per key, in the keys' first-seen order."""
    hits: dict[str, list[bool]] = {}
    replies = _answers(policy, [item for _, item in keyed], temperature, seed)
    for (key, item), reply in zip(keyed, replies):
        hits.setdefault(key, []).append(score(item, reply, policy.tool_format))
    return {key: sum(h) / len(h) for key, h in hits.items()}


def _answers(policy: Policy, items: list[Item], temperature: float = 0.0, seed: int = 0) -> list[str]:
    """One reply each (greedy at temperature 0, else seeded per item), with a budget of the expected
    answer's length + 8 tokens."""

    async def answer(number: int, item: Item) -> str:
        prompt = policy.encode(policy.render(item.messages, item.tools, generation_prompt=True))
        budget = len(policy.encode(item.answer)) + 8
        params = SamplingParams(temperature=temperature, max_tokens=budget, seed=seed + number)
        (done,) = await policy.engine.generate(prompt, params)
        return policy.decode(done.ids, skip_special=True)

    async def run() -> list[str]:
        return await asyncio.gather(*(answer(n, item) for n, item in enumerate(items)))

    return asyncio.run(run())
