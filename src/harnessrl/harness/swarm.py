"""An orchestrator's swarm: tools that create sub-agents and assign them tasks, run on frozen models.

The orchestrator is ordinary agent code with three more tools (Kimi K2.5's Agent Swarm):
`create_subagent(name, instructions)`, `assign_task(agent, task)` and `assign_tasks(assignments)`
(several at once). Every assignment is one sub-agent conversation, run by the harness author's
`SubAgent` function on a frozen model; the tool calls of one orchestrator reply run concurrently
(`max_parallel` runs at once, the rest wait for a slot), and only each sub-agent's final output
returns, as the tool result. A sub-agent that raises, times out or runs out of steps comes back as
an error observation and counts as unfinished; it never fails the episode.

    swarm = Swarm(llm, run_subagent, model="searcher")
    response = await llm.chat.completions.create(..., tools=swarm.schemas + mine.schemas)
    results = await swarm.execute(response, mine)   # tool messages, in order

Each sub-agent's `llm` fills in the frozen `model` and the call-tree `metadata` (agent, lineage,
parent = the orchestrator reply that assigned it) on every request, so its calls hang under that
reply in the episode's call tree (`harnessrl.calltree`). `summary()` goes into the outcome's
`info["swarm"]`, where the PARL reward terms read it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import re
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict, Field

from harnessrl.calltree import stage_steps
from harnessrl.harness.tools import Toolbox

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class SwarmLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_subagents: int = Field(default=8, ge=1, description="sub-agents create_subagent may define")
    max_assignments: int = Field(default=16, ge=1, description="sub-agent runs per episode")
    max_parallel: int = Field(
        default=8, ge=1, description="sub-agent runs of an episode at once (more wait); assignments per assign_tasks"
    )
    max_subagent_steps: int = Field(default=6, ge=1, description="model calls per sub-agent run")
    max_orchestrator_steps: int = Field(default=8, ge=1, description="orchestrator replies per episode")
    max_critical_steps: int | None = Field(default=None, ge=1, description="budget in critical steps; None: none")
    subagent_timeout: float = Field(default=120.0, gt=0, description="seconds per sub-agent run")

    def tool_seconds(self) -> float:
        """The longest one swarm tool call may take: a reply's runs (max_assignments at most) go in rounds of
        max_parallel, each up to subagent_timeout, and 30 s more for the rest (the tool's own timeout)."""
        return -(-self.max_assignments // self.max_parallel) * self.subagent_timeout + 30


@dataclass
class Assignment:
    """What a sub-agent run is given; `llm` calls carry `model` and `metadata` by themselves."""

    agent: str
    instructions: str
    task: str
    lineage: str
    max_steps: int


@dataclass
class SubAgentRun:
    agent: str
    lineage: str
    task: str
    output: str | None = None
    error: str | None = None
    steps: int = 0

    @property
    def finished(self) -> bool:
        return self.output is not None and self.error is None


# the orchestrator reply whose tool calls are running, and the runs they started (set by Swarm.execute;
# each episode is its own asyncio task, so concurrent episodes never see each other's)
_PARENT: contextvars.ContextVar[str] = contextvars.ContextVar("swarm_parent")
_STAGE: contextvars.ContextVar[list[SubAgentRun]] = contextvars.ContextVar("swarm_stage")


def _task_key(task: str) -> str:
    """A task's text as repeats compare it: Unicode forms (NFKC: full-width letters), invisible format characters (a
    zero-width space), case, spacing and trailing punctuation aside ("x > 5" is not "x < 5")."""
    text = "".join(ch for ch in unicodedata.normalize("NFKC", task) if unicodedata.category(ch) != "Cf")
    return " ".join(text.casefold().split()).rstrip(".?!;:, ")


# async def run_subagent(assignment, llm) -> str | None: the final output (None or blank: gave none, unfinished)
SubAgent = Callable[[Assignment, Any], Awaitable[str | None]]


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


class StepLimitError(RuntimeError):
    """A sub-agent asked for more model calls than its run allows."""


class BoundLLM:
    """An llm whose `chat.completions.create(**kw)` goes to `model` with `metadata` merged in (the agent
    code may name any model); counts the calls that returned and refuses more than `max_calls`."""

    def __init__(self, llm, model: str, metadata: dict[str, str], max_calls: int | None = None):
        self._llm, self._model, self._metadata, self.max_calls = llm, model, metadata, max_calls
        self.calls = 0
        self._pending = 0  # calls sent, not returned yet: each holds a step against max_calls until it ends
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **kwargs):
        asked = kwargs.get("n") or 1  # the gateway records each of n choices as a call: each is a step
        if self.max_calls is not None and self.calls + self._pending + asked > self.max_calls:
            raise StepLimitError(f"step limit: {self.max_calls} model calls per sub-agent run")
        kwargs.update(model=self._model, metadata={**(kwargs.get("metadata") or {}), **self._metadata})
        self._pending += asked
        try:
            response = await self._llm.chat.completions.create(**kwargs)
        finally:
            self._pending -= asked
        # steps once it returned: a call cancelled (subagent_timeout) or refused (400) is not in the call tree, and
        # counting it would put Swarm.critical_steps past calltree's and spend the budget on nothing
        self.calls += len(response.choices)
        # the gateway's own policy answered under its own name (a proxied frozen model answers under its upstream's
        # name and fingerprint; a pinned one under the name asked for): a misspelt --frozen name lands here
        own = str(getattr(response, "system_fingerprint", "") or "").startswith("policy-v")
        if own and getattr(response, "model", self._model) != self._model:
            _warn_once(
                f"sub-agent model {self._model!r} is not one the gateway serves frozen: {response.model!r}, the "
                "trainable policy, answers, and its sub-agents' calls are trained (serve it with --frozen "
                f"{self._model}=MODEL to keep them frozen)"
            )
        return response


@dataclass
class Swarm:
    llm: openai.AsyncOpenAI
    subagent: SubAgent
    model: str  # the frozen model sub-agents call
    limits: SwarmLimits = field(default_factory=SwarmLimits)
    agents: dict[str, str] = field(default_factory=dict)  # name -> instructions
    runs: list[SubAgentRun] = field(default_factory=list)
    orchestrator_steps: int = 0
    critical_steps: int = 0  # as the calls happen; harnessrl.calltree recomputes it from the record

    def __post_init__(self) -> None:
        self.tools = Toolbox(
            [self.create_subagent, self.assign_task, self.assign_tasks], timeout=self.limits.tool_seconds()
        )
        # max_parallel holds across the tool calls of a reply (several assign_task, two assign_tasks): runs past it
        # wait for a slot rather than being refused
        self._slots = asyncio.Semaphore(self.limits.max_parallel)

    @property
    def schemas(self) -> list[dict]:
        return self.tools.schemas

    @property
    def exhausted(self) -> str | None:
        """Why the orchestrator must stop now (step or critical-step budget spent), or None."""
        if self.orchestrator_steps >= self.limits.max_orchestrator_steps:
            return f"orchestrator step limit ({self.limits.max_orchestrator_steps})"
        budget = self.limits.max_critical_steps
        if budget is not None and self.critical_steps >= budget:
            return f"critical-step budget ({budget})"
        return None

    # ---- the orchestrator's tools (their docstrings are what the model sees) -------------------

    async def create_subagent(self, name: str, instructions: str) -> str:
        """Define a sub-agent that later tasks can be assigned to.

        Args:
            name: a short name for it (1-64 letters, digits, '_' or '-'; not 'main')
            instructions: what it is for and how it should work
        """
        if not _NAME.fullmatch(name) or name == "main":  # it becomes the calls' agent name and lineage (`name/N`)
            return f"error: name {name[:80]!r}: 1-64 letters, digits, '_' or '-', and not 'main' (the orchestrator's)"
        if name not in self.agents and len(self.agents) >= self.limits.max_subagents:
            return f"error: at most {self.limits.max_subagents} sub-agents; reuse one of {', '.join(self.agents)}"
        self.agents[name] = instructions
        return f"created {name}"

    async def assign_task(self, agent: str, task: str) -> str:
        """Give one task to a sub-agent; returns its final output.

        Args:
            agent: the sub-agent's name
            task: what it should do
        """
        return (await self._assign([(agent, task)]))[0]

    async def assign_tasks(self, assignments: list[dict[str, str]]) -> str:
        """Give several tasks at once, run in parallel; returns their outputs as a JSON object keyed by
        position ("1", "2", ...).

        Args:
            assignments: [{"agent": name, "task": text}, ...]
        """
        pairs = []
        for i, item in enumerate(assignments):
            if set(item) != {"agent", "task"}:
                return f"error: assignments.{i}: needs exactly the keys agent and task"
            pairs.append((item["agent"], item["task"]))
        if len(pairs) > self.limits.max_parallel:
            return f"error: at most {self.limits.max_parallel} assignments at once"
        outputs = await self._assign(pairs)  # numbered: a model copying them back keeps its place where they repeat
        return json.dumps({str(i + 1): o for i, o in enumerate(outputs)}, ensure_ascii=False)

    # ---- running them -----------------------------------------------------------------------

    async def execute(self, response, others: Toolbox | None = None) -> list[dict]:
        """Run every tool call of an orchestrator reply (create_subagent first, then the rest
        concurrently); the tool messages, in the reply's order.

        Counts one orchestrator step and its stage's critical steps (1 + the longest sub-agent run
        it started). Calls to tools of neither toolbox come back as errors naming the tools of both."""
        message = response.choices[0].message
        self.orchestrator_steps += 1
        stage: list[SubAgentRun] = []
        tokens = _PARENT.set(response.id), _STAGE.set(stage)

        async def run(call) -> dict:
            name, arguments = call.function.name, call.function.arguments
            box = next((b for b in (self.tools, others) if b is not None and name in b.tools), None)
            if box is None:  # named here, not by `others`, which would offer its own tools alone
                available = [*self.tools.tools, *(others.tools if others is not None else ())]
                text = f"error: unknown tool {name!r}; available: {', '.join(available)}"
            else:
                text, _ = await box.call(name, arguments)
            return {"role": "tool", "tool_call_id": call.id, "content": text}

        calls = list(enumerate(message.tool_calls or []))
        try:  # sub-agents are defined first, so one reply can create a sub-agent and assign it work
            done = {i: await run(c) for i, c in calls if c.function.name == "create_subagent"}
            rest = [(i, c) for i, c in calls if i not in done]
            done |= dict(zip((i for i, _ in rest), await asyncio.gather(*(run(c) for _, c in rest))))
        finally:
            _PARENT.reset(tokens[0])
            _STAGE.reset(tokens[1])
        self.critical_steps += 1 + stage_steps([r.steps for r in stage], self.limits.max_parallel)
        return [done[i] for i, _ in calls]

    async def _assign(self, pairs: list[tuple[str, str]]) -> list[str]:
        parent, stage = _PARENT.get(None), _STAGE.get(None)
        if parent is None or stage is None:
            raise RuntimeError("assign sub-agent tasks through Swarm.execute(response), which knows the parent call")
        out: list[str | None] = [None] * len(pairs)
        todo = []
        steps = self._steps_left()
        for i, (agent, task) in enumerate(pairs):
            if not steps:
                out[i] = f"error: the critical-step budget ({self.limits.max_critical_steps}) leaves sub-agents no step"
            elif agent not in self.agents:
                out[i] = f"error: no sub-agent {agent!r}; create_subagent first" + (
                    f" (have: {', '.join(self.agents)})" if self.agents else ""
                )
            elif len(self.runs) >= self.limits.max_assignments:
                out[i] = f"error: at most {self.limits.max_assignments} assignments per episode"
            else:
                run = SubAgentRun(agent, f"{agent}/{len(self.runs)}", task)
                self.runs.append(run)
                stage.append(run)
                todo.append((i, run))
        done = await asyncio.gather(*(self._run(run, parent, steps) for _, run in todo))
        for (i, _), text in zip(todo, done):
            out[i] = text
        return [o or "" for o in out]

    def _steps_left(self) -> int:
        """A sub-agent run's step limit now: `max_subagent_steps`, and no more than the critical-step budget leaves
        after the reply that assigns it (a stage costs 1 + its longest run) and one more reply, to answer with what
        came back: no reply overshoots the budget, and the orchestrator always gets to answer."""
        budget, limit = self.limits.max_critical_steps, self.limits.max_subagent_steps
        return limit if budget is None else max(0, min(limit, budget - self.critical_steps - 2))

    async def _run(self, run: SubAgentRun, parent: str, limit: int) -> str:
        assignment = Assignment(run.agent, self.agents[run.agent], run.task, run.lineage, limit)
        metadata = {"agent": run.agent, "lineage": run.lineage, "parent": parent}
        llm = BoundLLM(self.llm, self.model, metadata, limit)
        try:
            async with self._slots:
                deadline = asyncio.timeout(self.limits.subagent_timeout)  # from when the run has its slot
                async with deadline:
                    output = await self.subagent(assignment, llm)
                    run.output = output if output and output.strip() else None  # a blank output is none: unfinished
        except asyncio.CancelledError as exc:  # raised by the sub-agent itself, not a cancel of this run: its failure
            if asyncio.current_task().cancelling():
                raise
            run.error = f"CancelledError: {exc}".removesuffix(": ")
        except SystemExit as exc:  # argparse refusing its input, as in a tool (Toolbox): not the process's end
            run.error = f"the sub-agent called sys.exit({exc.code!r})"
        except Exception as exc:  # a failing sub-agent is an observation, never a failed episode
            # the swarm's timeout only where its deadline expired: the sub-agent's own TimeoutError (a socket's, its
            # wait_for's) is its failure, named as any other
            ours = isinstance(exc, TimeoutError) and deadline.expired()
            run.error = f"timed out after {self.limits.subagent_timeout} s" if ours else f"{type(exc).__name__}: {exc}"
        finally:
            run.steps = llm.calls
        if run.error is not None:
            return f"error: sub-agent {run.agent} ({run.lineage}) did not finish: {run.error}"
        if run.output is None:
            return f"error: sub-agent {run.agent} ({run.lineage}) gave no output in {run.steps} steps"
        return run.output

    def summary(self) -> dict[str, Any]:
        """What the episode's outcome records under info["swarm"]. `distinct`: the assignments whose task text
        differs (as `_task_key` compares them, whatever agent ran them); `distinct_finished`: those
        that finished at least once. The PARL terms count these, so repeating one task pays no more than asking it
        once."""
        return {
            "subagents": len(self.agents),
            "assigned": len(self.runs),
            "finished": sum(r.finished for r in self.runs),
            "distinct": len({_task_key(r.task) for r in self.runs}),
            "distinct_finished": len({_task_key(r.task) for r in self.runs if r.finished}),
            "orchestrator_steps": self.orchestrator_steps,
            "critical_steps": self.critical_steps,
            "runs": [asdict(r) for r in self.runs],
        }
