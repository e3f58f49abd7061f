"""A scripted, deliberately imperfect expert for SFT demonstrations, for any corpus in the JSONL format.

It knows each task's gold documents and answer, but acts only on what its context shows, so that
a model can learn to imitate it: search with the question; for each gold document not yet in
context, search for its title (or opening words) — the bridge entity a multi-hop question leads
to — and read the document when only part of it was shown; prune chunks it does not need once
past half the budget, and, once its context has reached the budget (where the agent's tools refuse a search or a
read), everything but the chunks holding the answer and the document naming the next hop before its next search or
read; answer, by the agent's last turn (`max_turns`) at the
latest: a step that would take it is left out, as the agent could not answer after it. An answer that is not in its
context then (the budget or the turns left a gold document unread) fails the demonstration, which SFT leaves out:
the agent could not have given it. Imperfections: it sometimes reads a distractor from the results,
sometimes cites one gold document too few or one distractor too many. Each turn is recorded
through the gateway's `POST /v1/demonstrations`, so demonstrations have exactly the prompts,
template and token reuse of real rollouts.
"""

from __future__ import annotations

import json
import random
from typing import Literal

import openai

from harnessrl.envs.search.data import normalise
from harnessrl.envs.search.harness import SearchAgent, _Run
from harnessrl.types import Outcome, Task


class SearchExpert:
    """`prune`: "past_half" (prune what it does not need once past half the budget), "always" (after
    every step), "never". `extra_searches`: more searches with the question before answering."""

    def __init__(self, agent: SearchAgent, seed: int = 0, p_distractor: float = 0.1, p_skip: float = 0.1, p_extra_doc: float = 0.1,
                 prune: Literal["past_half", "always", "never"] = "past_half", extra_searches: int = 0):  # fmt: skip
        self.agent, self.seed = agent, seed
        self.p_distractor, self.p_skip, self.p_extra_doc = p_distractor, p_skip, p_extra_doc
        self.prune, self.extra_searches = prune, extra_searches

    async def __call__(self, task: Task, llm: openai.AsyncOpenAI) -> Outcome:
        rng = random.Random(f"{self.seed}:{task.id}")
        run = _Run(self.agent, task)
        index = self.agent.index
        gold = list(task.data.get("gold_doc_ids", []))

        expected = task.data.get("answer", "")
        answer = normalise(expected)
        hop: list[str] = []  # the gold document that names the one being looked for (kept: the search reads it)

        def room() -> list[str]:
            """What to prune at the budget: everything in context but what the next steps need, the chunks holding
            the answer and the document that names the next hop (the hops before it are made)."""
            return [c for c in run.shown if c not in run.pruned and index.by_id[c].doc_id not in hop
                    and f" {answer} " not in f" {normalise(index.by_id[c].text)} "]  # fmt: skip

        async def do(name: str, **arguments) -> None:
            if name != "answer" and run.turns >= self.agent.max_turns - 1:  # the last turn the agent has answers
                return
            if name not in ("answer", "prune_chunks") and run.used >= self.agent.budget:  # it would be refused
                if run.turns >= self.agent.max_turns - 2 or not (everything := room()):  # no turn for both
                    return
                await do("prune_chunks", chunk_ids=everything)
            reply = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{run.turns}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}  # fmt: skip
            body = {"messages": run.messages, "tools": run.tools.schemas, "reply": reply}
            recorded = await llm.post("/demonstrations", cast_to=object, body=body)
            await run.act(reply, recorded["prompt_tokens"] + recorded["completion_tokens"])
            if self.prune == "always" or (self.prune == "past_half" and run.used > self.agent.budget / 2):
                stale = sorted(c for c in run.shown if c not in run.pruned and index.by_id[c].doc_id not in gold)
                if stale and name not in ("prune_chunks", "answer"):
                    await do("prune_chunks", chunk_ids=stale)

        def unseen(doc_id: str) -> list[str]:
            return [c.id for c in index.chunks_of(doc_id) if c.id not in run.shown]

        await do("search_corpus", query=task.prompt)
        distractors = [d for d in run.seen_docs if d not in gold]
        if distractors and rng.random() < self.p_distractor:
            await do("read_document", doc_id=distractors[0])
        for previous, doc_id in zip([None, *gold], gold):
            hop[:] = [previous] if previous else []
            if not unseen(doc_id):
                continue
            if doc_id not in run.seen_docs:
                doc = index.document(doc_id)
                await do("search_corpus", query=doc.title or " ".join(doc.text.split()[:8]))
            if unseen(doc_id) and doc_id in run.seen_docs:  # an id the results showed, never one it alone knows
                await do("read_document", doc_id=doc_id)
        for _ in range(self.extra_searches):
            await do("search_corpus", query=task.prompt)
        cited = list(gold)
        if len(cited) > 1 and rng.random() < self.p_skip:
            cited.pop(rng.randrange(len(cited)))
        if distractors and rng.random() < self.p_extra_doc:
            cited.append(distractors[0])
        context = normalise(" ".join(m["content"] for m in run.messages if m["role"] == "tool"))
        if f" {answer} " not in f" {context} ":  # a gold document left unread: not a demonstration
            unread = [d for d in gold if d not in run.seen_docs]
            raise RuntimeError(f"the answer {expected!r} is not in the expert's context (gold documents "
                               f"unread: {unread}; context {run.used} of {self.agent.budget} tokens, {run.turns} of {self.agent.max_turns} turns)")  # fmt: skip
        await do("answer", text=expected, doc_ids=cited)
        return run.outcome()
