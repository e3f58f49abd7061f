"""Shared fixtures: the tiny policy, one taught to call a tool, and gateways on real sockets."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from click.testing import Result
from typer.testing import CliRunner

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harnessrl.cli import app  # noqa: E402
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


def cli(*args) -> Result:
    """`harnessrl ARGS` in this process: the CLI's own code, exit code, stdout and stderr, without the ~10 s
    a new Python spends importing torch and transformers. Where a process is what a test is about (a job
    that is killed, a server), it runs as one."""
    return CliRunner().invoke(app, [str(a) for a in args])


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


AGENT_SYSTEM = "You report the weather."
FOLLOW_UP = "And in Paris tomorrow?"


def agent_dialogue(turns: int = 5) -> list[dict]:
    """The conversation the gateway tests' agent loop has when the model behaves as taught: a tool call,
    an answer, a follow-up question, and again (`turns` assistant turns)."""
    dialogue = weather_dialogue()
    dialogue[2]["content"] = "sunny in Paris"
    messages = [{"role": "system", "content": AGENT_SYSTEM}, dialogue[0]]
    while sum(m["role"] == "assistant" for m in messages) < turns:
        messages += (
            dialogue[1:3] if messages[-1]["role"] == "user" else [dialogue[3], {"role": "user", "content": FOLLOW_UP}]
        )
    return messages


def teach_tool_use(
    policy: Policy,
    min_prob: float = 0.995,
    max_steps: int = 1000,
    lr: float = 3e-3,
    fresh: bool = True,
    last_layers: int | None = None,
) -> int:
    """Fit a copy of tiny (`fresh`) or of the policy's own model to two tool-using dialogues (assistant
    tokens only), then push its weights; returns the steps taken. `last_layers`: train only the last N
    decoder layers (a real model's backward through all of them is most of a step's time).

    Teaching stops when every taught token has probability >= `min_prob` under the taught model, not
    after a fixed number of steps: with that margin, greedy and seeded sampling reproduce the taught
    turns whatever the CPU's float rounding (AVX2, AVX-512 and AMX round differently), so the gateway
    tests do not depend on one machine's numerics.
    """
    model = build_tiny(seed=0)[0] if fresh else copy.deepcopy(policy.model)
    model.train()
    if last_layers is not None:
        model.requires_grad_(False)
        model.get_decoder().layers[-last_layers:].requires_grad_(True)
    rows = [_taught_tokens(policy, weather_dialogue()), _taught_tokens(policy, agent_dialogue())]
    width = max(len(ids) for ids, _ in rows)
    inputs = torch.tensor([ids + [0] * (width - len(ids)) for ids, _ in rows])
    targets = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in rows])[:, 1:]
    attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    taught = targets != -100
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    for step in range(max_steps):
        hidden = model.get_decoder()(input_ids=inputs, attention_mask=attention).last_hidden_state[:, :-1]
        logits = model.get_output_embeddings()(hidden[taught]).float()  # the taught positions only
        token_logp = torch.log_softmax(logits, -1).gather(-1, targets[taught][:, None]).squeeze(-1)
        if float(token_logp.detach().min().exp()) >= min_prob:
            policy.update_weights(model.state_dict())
            return step
        (-token_logp.mean()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # tiny: ~70 steps instead of ~215 at lr 3e-3
        optimizer.step()
        optimizer.zero_grad()
    raise RuntimeError(f"teach_tool_use: a taught token is still below probability {min_prob} after {max_steps} steps")


def _taught_tokens(policy: Policy, dialogue: list[dict]) -> tuple[list[int], list[int]]:
    """The dialogue's ids and labels that are -100 everywhere but on the assistant turns."""
    ids = policy.encode(policy.render(dialogue, WEATHER_TOOLS, generation_prompt=False))
    labels = [-100] * len(ids)
    for k, message in enumerate(dialogue):
        if message["role"] == "assistant":
            start = len(policy.encode(policy.render(dialogue[:k], WEATHER_TOOLS, generation_prompt=True)))
            end = len(policy.encode(policy.render(dialogue[: k + 1], WEATHER_TOOLS, generation_prompt=False)))
            labels[start:end] = ids[start:end]
    return ids, labels


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


@pytest.fixture(scope="session")
def swarm_models():
    """A trainable tiny and a frozen one (another seed) for the swarm and call-tree tests."""
    trainable, frozen = Policy.load("tiny"), Policy.load("tiny", seed=1)
    yield trainable, frozen
    trainable.close(), frozen.close()


@pytest.fixture
async def swarm_gateway(swarm_models):
    """An in-process gateway serving the trainable tiny and the frozen one as model "sub"."""
    from harnessrl.gateway.models import Pinned

    trainable, frozen = swarm_models
    client = GatewayClient(ADMIN_KEY, app=create_app(trainable, ADMIN_KEY, frozen={"sub": Pinned(frozen)}))
    yield client
    await client.aclose()
