"""A small product to run the production loop on: a weather assistant, its users, and its benchmark.

- `assistant(llm, question)`: the product's agent, plain `openai` code: one model call with the
  `get_weather` tool, the tool run, one more call for the answer.
- `harness(task, llm)`: the same agent as a harness (what the loop's benchmark runs).
- `User` / `traffic(...)`: a scripted user population with a hidden preference: a user accepts an
  answer when the assistant looked up *their* city (the first reply calls `get_weather` with it),
  marks it `edited` when it looked up some other city, says a dissatisfied follow-up when it was
  asked a question back, and rejects it otherwise. Some users give no feedback at all, and some
  walk away without closing their session (the server's TTL expires it).
- `preference(episode)`: the hidden preference as a score in [0, 1], on held-out cities: the
  benchmark the gate and the end-to-end figures use.
"""

from __future__ import annotations

import asyncio
import json
import random

import openai

from harnessrl.gateway import GatewayClient
from harnessrl.types import Episode, Outcome, Task

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
SYSTEM = "You answer weather questions."
CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Quito", "Perth", "Dakar", "Hanoi", "Bern", "Riga", "Rome", "Doha"]
# benchmark.jsonl holds 24 other cities (Kyiv, Accra, ...), never in the traffic


async def assistant(llm: openai.AsyncOpenAI, question: str, model: str = "weather") -> tuple[str, str | None]:
    """(answer, city looked up first or None)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    looked_up = None
    for _ in range(2):
        response = await llm.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=40)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or "", looked_up
        for call in message.tool_calls:
            try:
                city = json.loads(call.function.arguments).get("city")
            except (json.JSONDecodeError, AttributeError):
                city = None
            looked_up = looked_up or (city if isinstance(city, str) else "")
            result = f"{city}: sunny, 21 C" if isinstance(city, str) else "error: no city given"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return "", looked_up


async def harness(task: Task, llm: openai.AsyncOpenAI) -> Outcome:
    answer, looked_up = await assistant(llm, task.prompt)
    return Outcome(answer=answer, info={"looked_up": looked_up})


def preference(episode: Episode) -> float:
    """1 when the assistant looked up the user's own city, else 0 (the users' hidden preference)."""
    info = episode.outcome.info if episode.outcome else {}
    return float(info.get("looked_up") == episode.task.data["city"])


def question(city: str) -> Task:
    return Task(prompt=f"What is the weather in {city}?", data={"city": city})


def signal(city: str, answer: str, looked_up: str | None) -> str:
    """What a user with the hidden preference answers."""
    if looked_up == city:
        return "accepted"
    if looked_up:
        return "edited"
    return "dissatisfied" if answer.strip().endswith("?") else "rejected"


async def visit(gateway: GatewayClient, city: str, rng: random.Random, quiet: float, leave: float) -> str:
    """One user's session; returns what happened (for the driver's counts)."""
    episode_id, key = await gateway.create_episode(question(city))
    answer, looked_up = await assistant(gateway.openai(key), question(city).prompt)
    if rng.random() < leave:  # walks away: no finish, no feedback (the TTL expires the session)
        return "left"
    await gateway.finish(episode_id, Outcome(answer=answer, info={"looked_up": looked_up}))
    if rng.random() < quiet:
        return "no feedback"
    said = signal(city, answer, looked_up)
    await gateway.feedback(episode_id, said)
    return said


async def traffic(base_url: str, admin_key: str, users: int, seed: int, quiet: float = 0.1, leave: float = 0.05):
    """`users` sessions from the traffic cities, 16 at a time; returns the count of each outcome."""
    rng = random.Random(seed)
    gateway = GatewayClient(admin_key, base_url=base_url)
    slots = asyncio.Semaphore(16)

    async def one(city: str) -> str:
        async with slots:
            return await visit(gateway, city, rng, quiet, leave)

    try:
        results = await asyncio.gather(*(one(rng.choice(CITIES)) for _ in range(users)))
    finally:
        await gateway.aclose()
    return {k: results.count(k) for k in sorted(set(results))}
