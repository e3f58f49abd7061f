"""Shared fixtures: the tiny policy, one taught to call a tool, and gateways on real sockets."""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harnessrl.gateway import BackgroundServer, GatewayClient, create_app  # noqa: E402
from harnessrl.policy import Policy  # noqa: E402
from harnessrl.policy.tiny import build_tiny  # noqa: E402

ADMIN_KEY = "test-admin-key-0123"
WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def weather_dialogue(city: str = "Paris") -> list[dict]:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }
    return [
        {"role": "user", "content": f"Weather in {city}?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]


def teach_tool_use(policy: Policy) -> None:
    """Fit a copy of tiny to one tool-using dialogue (assistant tokens only), then push its weights."""
    model, _ = build_tiny(seed=0)
    model.train()
    dialogue = weather_dialogue()
    ids = policy.encode(policy.render(dialogue, WEATHER_TOOLS, generation_prompt=False))
    labels = [-100] * len(ids)
    for k in (1, 3):  # the two assistant turns
        start = len(policy.encode(policy.render(dialogue[:k], WEATHER_TOOLS, generation_prompt=True)))
        end = len(policy.encode(policy.render(dialogue[: k + 1], WEATHER_TOOLS, generation_prompt=False)))
        labels[start:end] = ids[start:end]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    inputs, targets = torch.tensor([ids]), torch.tensor([labels])
    for _ in range(300):
        loss = model(input_ids=inputs, labels=targets).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if loss.item() < 0.01:
            break
    policy.update_weights(model.state_dict())


@pytest.fixture(scope="session")
def policy():
    p = Policy.load("tiny")
    yield p
    p.close()


@pytest.fixture(scope="session")
def tool_policy():
    p = Policy.load("tiny")
    teach_tool_use(p)
    yield p
    p.close()


@pytest.fixture(scope="session")
def tool_server(tool_policy):
    with BackgroundServer(create_app(tool_policy, ADMIN_KEY, max_request_bytes=64 * 1024)) as server:
        yield server


@pytest.fixture
async def gateway(tool_server):
    client = GatewayClient(ADMIN_KEY, base_url=tool_server.base_url)
    yield client
    await client.aclose()
