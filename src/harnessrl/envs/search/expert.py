"""A scripted, deliberately imperfect expert for SFT demonstrations, for any corpus in the JSONL format.

It knows each task's gold documents and answer and acts through the search agent's own tools:
search with the question, sometimes read a distractor from the results first, read the gold
documents (sometimes skipping one), prune what it does not need once past half the budget, answer
(sometimes citing an extra document). Each turn is recorded through the gateway's
`POST /v1/demonstrations`, so the demonstrations have exactly the prompts, template and token
reuse of real rollouts.
"""

from __future__ import annotations

import json
import random

import openai

from harnessrl.envs.search.harness import SearchAgent, _Run
from harnessrl.types import Outcome, Task


class SearchExpert:
    def __init__(self, agent: SearchAgent, seed: int = 0, p_distractor: float = 0.2, p_skip: float = 0.1, p_extra_doc: float = 0.1):
        self.agent, self.seed = agent, seed
        self.p_distractor, self.p_skip, self.p_extra_doc = p_distractor, p_skip, p_extra_doc

    async def __call__(self, task: Task, llm: openai.AsyncOpenAI) -> Outcome:
        rng = random.Random(f"{self.seed}:{task.id}")
        run = _Run(self.agent, task)
        gold = list(task.data.get("gold_doc_ids", []))

        async def do(name: str, **arguments) -> None:
            reply = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{run.turns}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}  # fmt: skip
            body = {"messages": run.messages, "tools": run.tools.schemas, "reply": reply}
            recorded = await llm.post("/demonstrations", cast_to=object, body=body)
            await run.act(reply, recorded["prompt_tokens"] + recorded["completion_tokens"])

        await do("search_corpus", query=task.prompt)
        distractors = [d for d in run.seen_docs if d not in gold]
        if distractors and rng.random() < self.p_distractor:
            await do("read_document", doc_id=distractors[0])
        for doc_id in gold:
            if len(gold) > 1 and rng.random() < self.p_skip:
                continue
            await do("read_document", doc_id=doc_id)
            if run.used > self.agent.budget / 2:
                stale = [c for c in run.shown if c not in run.pruned and c.split("#")[0] not in gold]
                if stale:
                    await do("prune_chunks", chunk_ids=sorted(stale))
        cited = gold + (distractors[:1] if distractors and rng.random() < self.p_extra_doc else [])
        await do("answer", text=task.data.get("answer", ""), doc_ids=cited)
        return run.outcome()
