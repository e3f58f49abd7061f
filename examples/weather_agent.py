"""An ordinary OpenAI-client agent with tools, recorded by a harnessrl gateway.

Start a gateway first:   harnessrl serve --model tiny --port 8000 --admin-key dev-admin-key
then:                    python examples/weather_agent.py --base-url http://127.0.0.1:8000

The agent loop below is plain `openai` code: only the base URL and the API key (one per episode)
come from harnessrl. After five turns it reads the episode back and checks that every call's
prompt ids begin with the previous call's prompt ids + sampled completion ids (token-exact).
The untrained tiny model answers gibberish; the recording is what this example shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import openai

from harnessrl.gateway import GatewayClient
from harnessrl.types import Outcome, Task

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


def get_weather(city: str) -> str:
    return f"{city}: sunny, 21 C"


async def agent(client: openai.AsyncOpenAI, question: str, turns: int = 5) -> str:
    """The user's agent: call the model, run the tools it asks for, keep the conversation going."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    answer = ""
    for _ in range(turns):
        response = await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=48)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            try:
                result = get_weather(**json.loads(call.function.arguments))
            except (TypeError, json.JSONDecodeError) as exc:  # a bad call is an observation, not a crash
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if not message.tool_calls:
            answer = message.content or ""
            messages.append({"role": "user", "content": "Thanks. And tomorrow?"})
    return answer


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--admin-key", default=os.environ.get("HARNESSRL_ADMIN_KEY", "dev-admin-key"))
    args = parser.parse_args()

    gateway = GatewayClient(args.admin_key, base_url=args.base_url)
    episode_id, episode_key = await gateway.create_episode(Task(prompt="Weather in Paris?"))
    answer = await agent(gateway.openai(episode_key), "Weather in Paris?")
    episode = await gateway.finish(episode_id, Outcome(answer=answer))
    await gateway.aclose()

    calls = episode.calls
    exact = all(
        c.prompt_ids[: len(p.prompt_ids) + len(p.completion_ids)] == p.prompt_ids + p.completion_ids
        for p, c in zip(calls, calls[1:])
    )
    print(json.dumps({
        "episode": episode.id,
        "calls": len(calls),
        "prompt_tokens": [len(c.prompt_ids) for c in calls],
        "completion_tokens": [len(c.completion_ids) for c in calls],
        "policy_version": [c.policy_version for c in calls],
        "token_exact": exact,
    }))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
