"""The wide-research harnesses: an orchestrator with swarm tools, and the single-agent baseline.

`WideOrchestrator` is ordinary agent code: the swarm's tools (`create_subagent`, `assign_task`,
`assign_tasks`) plus `answer(answers)`; its sub-agents are search agents (envs/search) on a frozen
model, each given one question. `SerialSearch` is the baseline: one search agent that takes the
questions one after another in the same episode (a fresh conversation per question, which is
generous: its context never fills), so its critical steps are all its steps.
"""

from __future__ import annotations

from typing import Literal

import openai

from harnessrl.envs.search.harness import SearchAgent, _Run
from harnessrl.harness import Toolbox
from harnessrl.harness.swarm import Assignment, BoundLLM, Swarm, SwarmLimits
from harnessrl.types import Outcome, Task

# how the orchestrator hands out the questions: one assign_tasks call whose one observation holds the
# outputs keyed by position ("batch"), or one assign_task call each, all in one reply ("each")
_LEAD = "You coordinate sub-agents that search a document collection. Create one sub-agent and assign it every "
SYSTEM = {
    "each": _LEAD + "question (one assign_task call per question, all in one reply: they run in parallel), then call "
    "answer with their answers keyed by question number.",
    "batch": _LEAD + "question in one assign_tasks call (they run in parallel), then call answer with their answers "
    "keyed by question number.",
}
NUDGE = {
    "each": "Use a tool: assign_task for each question, then answer.",
    "batch": "Use a tool: assign_tasks with every question, then answer.",
}
SUBAGENT_INSTRUCTIONS = "Answer the question from the documents."


def search_subagent(agent: SearchAgent):
    """A sub-agent that runs the search agent on its assigned question, for the run's steps at most (the swarm's
    `max_steps`: the critical-step budget may leave fewer than the agent's turns); its answer is the output.

    The `instructions` of create_subagent are not used: the sub-agent is the search agent under the system prompt it
    was trained with. Adding them would change every sub-agent prompt, and with it the frozen sub-agent's answers and
    the default job's demonstrations (the expert passes SUBAGENT_INSTRUCTIONS); saying so in create_subagent's
    schema would change every orchestrator prompt."""

    async def run(assignment: Assignment, llm) -> str | None:
        turns = min(agent.max_turns, assignment.max_steps)
        outcome = await _Run(agent, Task(prompt=assignment.task), turns).loop(llm)
        return outcome.answer or None

    return run


class WideOrchestrator:
    def __init__(
        self,
        subagent_model: str,
        searcher: SearchAgent,
        limits: SwarmLimits | None = None,
        max_tokens: int = 256,
        temperature: float = 1.0,
        assign: Literal["batch", "each"] = "batch",
    ):
        self.subagent_model, self.searcher, self.assign = subagent_model, searcher, assign
        self.limits = limits or SwarmLimits(
            max_subagent_steps=searcher.max_turns, max_orchestrator_steps=4, max_parallel=16, max_assignments=32
        )
        self.max_tokens, self.temperature = max_tokens, temperature

    def start(self, task: Task, llm: openai.AsyncOpenAI) -> tuple[Swarm, Toolbox, list[dict], dict]:
        """A fresh episode's swarm, own tools, messages, and the slot `answer` fills (for the expert too)."""
        final: dict = {}

        def answer(answers: dict[str, str]) -> str:
            """Final answers, keyed by question number ("1", "2", ...)."""
            final["answers"] = answers
            return "answers recorded"

        swarm = Swarm(llm, search_subagent(self.searcher), self.subagent_model, self.limits)
        messages = [{"role": "system", "content": SYSTEM[self.assign]}, {"role": "user", "content": task.prompt}]
        return swarm, Toolbox([answer]), messages, final

    async def __call__(self, task: Task, llm: openai.AsyncOpenAI) -> Outcome:
        swarm, mine, messages, final = self.start(task, llm)
        while "answers" not in final and not swarm.exhausted:
            response = await llm.chat.completions.create(
                model="policy", messages=messages, tools=swarm.schemas + mine.schemas,
                max_tokens=self.max_tokens, temperature=self.temperature,
            )  # fmt: skip
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            messages += await swarm.execute(response, mine)
            if not message.tool_calls:
                messages.append({"role": "user", "content": NUDGE[self.assign]})
        return outcome(final, swarm)


def outcome(final: dict, swarm: Swarm) -> Outcome:
    answers = final.get("answers") or {}
    return Outcome(answer=_text(answers), info={"answers": answers, "swarm": swarm.summary()})


def _text(answers: dict[str, str]) -> str:
    return "; ".join(f"{k}: {a}" for k, a in answers.items())


class SerialSearch:
    """The single-agent baseline: the search agent answers each question in turn (each its own lineage)."""

    def __init__(self, searcher: SearchAgent, model: str = "policy"):
        self.searcher, self.model = searcher, model

    async def __call__(self, task: Task, llm: openai.AsyncOpenAI) -> Outcome:
        answers = {}
        for i, question in enumerate(task.data["questions"]):
            bound = BoundLLM(llm, self.model, {"agent": "searcher", "lineage": f"searcher/{i}"})
            done = await _Run(self.searcher, Task(prompt=question)).loop(bound)
            answers[str(i + 1)] = done.answer or ""
        return Outcome(answer=_text(answers), info={"answers": answers})
