"""A scripted orchestrator for SFT demonstrations: create one search sub-agent, assign it every
question in one reply, so they run in parallel, then answer with what the sub-agents returned (an
error counts as no answer). The orchestrator's `assign` form says how: one `assign_tasks` call
("batch", the default: its one observation holds the outputs keyed by position, so the answer copies
one object) or one `assign_task` call each ("each": flat arguments, but the answer gathers eight
observations, and tiny-base skipped and repeated items doing so).

It knows nothing the model cannot see (it copies the questions and the sub-agents' outputs), so a
model can imitate it exactly. Its replies are recorded through the gateway's
`POST /v1/demonstrations` and its sub-agents really run, on the frozen model, under the reply that
assigned them.
"""

from __future__ import annotations

import json

import openai
from openai.types.chat import ChatCompletion

from harnessrl.envs.wide.harness import SUBAGENT_INSTRUCTIONS, WideOrchestrator, outcome
from harnessrl.types import Outcome, Task


async def demonstrate(
    llm: openai.AsyncOpenAI, messages: list[dict], tools: list[dict], tool_calls: list[dict]
) -> ChatCompletion:
    """Record a scripted assistant reply as the episode's next call; returned as the chat completion an agent would get."""
    reply = {
        "role": "assistant",
        "content": "" if tool_calls else "done",
        **({"tool_calls": tool_calls} if tool_calls else {}),
    }
    recorded = await llm.post(
        "/demonstrations", cast_to=object, body={"messages": messages, "tools": tools, "reply": reply}
    )
    return ChatCompletion.model_validate({
        "id": recorded["id"], "object": "chat.completion", "created": 0, "model": "demonstration",
        "choices": [{"index": 0, "message": reply, "finish_reason": "tool_calls" if tool_calls else "stop"}],
    })  # fmt: skip


def tool_call(index: int, tool: str, arguments: dict) -> dict:
    return {"id": f"call_{index}", "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}


class OrchestratorExpert:
    def __init__(self, orchestrator: WideOrchestrator, name: str = "searcher"):
        self.orchestrator, self.name = orchestrator, name

    async def __call__(self, task: Task, llm: openai.AsyncOpenAI) -> Outcome:
        swarm, mine, messages, final = self.orchestrator.start(task, llm)
        tools = swarm.schemas + mine.schemas
        questions = task.data["questions"]
        plan = [tool_call(0, "create_subagent", {"name": self.name, "instructions": SUBAGENT_INSTRUCTIONS})]
        if self.orchestrator.assign == "batch":
            plan += [
                tool_call(1, "assign_tasks", {"assignments": [{"agent": self.name, "task": q} for q in questions]})
            ]
        else:
            plan += [tool_call(i + 1, "assign_task", {"agent": self.name, "task": q}) for i, q in enumerate(questions)]
        response = await demonstrate(llm, messages, tools, plan)
        messages.append(response.choices[0].message.model_dump(exclude_none=True))
        results = await swarm.execute(response, mine)  # the assignments run in parallel
        messages += results
        if self.orchestrator.assign == "batch" and results[1]["content"].startswith("error:"):  # refused whole
            raise ValueError(f"the scripted assign_tasks of {len(questions)} questions: {results[1]['content']}")
        outputs = (
            json.loads(results[1]["content"])
            if self.orchestrator.assign == "batch"
            else {str(i + 1): r["content"] for i, r in enumerate(results[1:])}
        )
        answers = {k: "" if o.startswith("error:") else o for k, o in outputs.items()}
        response = await demonstrate(llm, messages, tools, [tool_call(len(plan), "answer", {"answers": answers})])
        messages.append(response.choices[0].message.model_dump(exclude_none=True))
        await swarm.execute(response, mine)
        return outcome(final, swarm)
