"""A scripted orchestrator over real frozen sub-agents: its replies are recorded through the gateway's
/v1/demonstrations (so they sit in the call tree), its sub-agents call a frozen tiny model."""

from __future__ import annotations

import json

from harnessrl.envs.wide.expert import demonstrate
from harnessrl.gateway import GatewayClient
from harnessrl.harness.swarm import Assignment, Swarm, SwarmLimits
from harnessrl.types import Outcome, Task

SYSTEM = {"role": "system", "content": "You are an orchestrator."}


async def worker(assignment: Assignment, llm) -> str:
    """A frozen sub-agent: one model call, its text is the output."""
    response = await llm.chat.completions.create(
        model="whatever",
        messages=[{"role": "system", "content": assignment.instructions}, {"role": "user", "content": assignment.task}],
        max_tokens=4,
    )
    return response.choices[0].message.content or "-"


async def chatterbox(assignment: Assignment, llm) -> str:
    """A sub-agent that never stops asking: it always runs out of steps."""
    while True:
        await worker(assignment, llm)


def call(tool: str, **arguments) -> dict:
    return {"id": f"c{tool}{len(json.dumps(arguments))}", "type": "function",
            "function": {"name": tool, "arguments": json.dumps(arguments)}}  # fmt: skip


async def run_scripted(
    gateway: GatewayClient,
    tasks: int | list[str],
    subagent=worker,
    limits: SwarmLimits | None = None,
    model: str = "sub",
    failure: str | None = None,
):
    """One episode: create a sub-agent, assign `tasks` tasks at once (if any; a number: "item 0", "item 1", ...),
    answer (or, given a `failure`, end failed as the rollout engine ends a timed-out episode, without an outcome).
    Returns (episode, swarm, the orchestrator's messages)."""
    texts = [f"item {i}" for i in range(tasks)] if isinstance(tasks, int) else tasks
    episode_id, key = await gateway.create_episode(Task(prompt="find things"))
    llm = gateway.openai(key)
    swarm = Swarm(llm, subagent, model=model, limits=limits or SwarmLimits())
    messages = [SYSTEM, {"role": "user", "content": "find things"}]
    plan = [[call("create_subagent", name="scout", instructions="Answer briefly.")]] if tasks else []
    if tasks:
        plan.append([call("assign_tasks", assignments=[{"agent": "scout", "task": t} for t in texts])])
    for tool_calls in [*plan, []]:
        response = await demonstrate(llm, messages, swarm.schemas, tool_calls)
        messages.append(response.choices[0].message.model_dump(exclude_none=True))
        messages += await swarm.execute(response)
    outcome = None if failure else Outcome(answer="done", info={"swarm": swarm.summary()})
    episode = await gateway.finish(episode_id, outcome, failure)
    return episode, swarm, messages
