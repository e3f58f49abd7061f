"""The search agent (Chroma Context-1 pattern): search, read, prune its own context, answer.

An ordinary openai-client loop over five tools. Every tool result ends with a usage line
(`[context: used/budget tokens]`); past half the budget it suggests pruning; at the budget only
`prune_chunks` (and `answer`) work. Pruning deletes the pruned chunks' lines from earlier tool
results — the history is edited, so the gateway starts a new training sequence there.
"""

from __future__ import annotations

import json

import openai

from harnessrl.envs.search.data import answers_match
from harnessrl.envs.search.index import Chunk, SearchIndex
from harnessrl.harness import Toolbox
from harnessrl.types import Outcome, Task

SYSTEM = "Answer the question from the documents. Search, read, prune what you no longer need, then answer."


class SearchAgent:
    def __init__(
        self,
        index: SearchIndex,
        context_budget: int = 2048,
        max_turns: int = 8,
        k: int = 3,
        max_tokens: int = 96,
        temperature: float = 1.0,
    ):
        self.index, self.budget, self.max_turns, self.k = index, context_budget, max_turns, k
        self.max_tokens, self.temperature = max_tokens, temperature

    async def __call__(self, task: Task, llm: openai.AsyncOpenAI) -> Outcome:
        run = _Run(self, task)
        return await run.loop(llm)


class _Run:
    """One episode's state: what is in context, what was shown, what was pruned."""

    def __init__(self, agent: SearchAgent, task: Task, max_turns: int | None = None):
        self.agent, self.task = agent, task
        self.max_turns = agent.max_turns if max_turns is None else max_turns  # a swarm run's may be fewer
        self.shown: dict[str, None] = {}  # chunk ids ever shown, oldest first (excluded from later searches)
        self.seen_docs: list[str] = []  # documents whose text entered the context, in order
        self.read: set[str] = set()  # documents read whole (read_document): an entry of their own in context
        self.pruned: set[str] = set()
        self.used = 0  # tokens of the last request (prompt + completion)
        self.peak = 0
        self.prune_streak = self.max_prune_streak = 0
        self.final: tuple[str, list[str]] | None = None
        self.turns = 0
        self.messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.prompt}]
        self.tools = Toolbox([self.search_corpus, self.grep_corpus, self.read_document, self.prune_chunks, self.answer])

    # ---- tools (their docstrings are what the model sees) -----------------------------------

    def search_corpus(self, query: str) -> str:
        """Search; returns new chunks."""
        return self._show(self.agent.index.search(query, self.agent.k, exclude=self.shown))

    def grep_corpus(self, pattern: str) -> str:
        """Chunks matching a case-insensitive regex."""
        return self._show(self.agent.index.grep(pattern, self.agent.k, exclude=self.shown))

    def read_document(self, doc_id: str) -> str:
        """Read a whole document."""
        doc = self.agent.index.document(doc_id)
        if doc is None:
            return f"error: no document {doc_id!r}"
        self._saw(doc_id)
        self.read.add(doc_id)
        self.pruned.difference_update([doc_id, *(c.id for c in self.agent.index.chunks_of(doc_id))])  # in context again
        self.shown.update(dict.fromkeys(c.id for c in self.agent.index.chunks_of(doc_id)))  # its text is in context now
        return self._document(doc_id)

    def prune_chunks(self, chunk_ids: list[str]) -> str:
        """Drop chunks (or whole documents read) from the context."""
        index = self.agent.index
        named = {c for c in chunk_ids if c not in self.pruned and (c in self.shown or c in self.seen_docs)}
        pruned = self.pruned | named
        # a document read whole leaves with its id, or with the last of its chunks (a one-chunk document: its chunk)
        new = named | {d for d in self.read - pruned if all(c.id in pruned for c in index.chunks_of(d))}
        self.pruned |= new
        dropped = new | {c.id for d in new for c in index.chunks_of(d) if c.id in self.shown}  # a document's chunks
        entries = [f"[{c}] {index.by_id[c].text}" for c in dropped if c in self.shown] + [
            self._document(d) for d in dropped if d in self.read
        ]
        for message in self.messages:
            if message["role"] == "tool":
                message["content"] = _drop(message["content"], entries)
        # the tool says what is still in context, and which ids it was asked for that were not there
        told = f"pruned {len(named)}"
        staying = sorted(c for c in named if c in index.by_id and index.by_id[c].doc_id in self.read - self.pruned)
        if staying:
            docs = sorted({index.by_id[c].doc_id for c in staying})
            told += f"; {json.dumps(staying)} stay inside {json.dumps(docs)}, read whole: prune those ids"
        if absent := [c for c in dict.fromkeys(chunk_ids) if c not in named]:
            told += f"; not in context: {json.dumps(absent)}"
        return told

    def answer(self, text: str, doc_ids: list[str]) -> str:
        """Final answer and supporting document ids."""
        self.final = (text, doc_ids)
        return "answer recorded"

    # ---- the loop -----------------------------------------------------------------------------

    async def loop(self, llm: openai.AsyncOpenAI) -> Outcome:
        while self.final is None and self.turns < self.max_turns:
            response = await llm.chat.completions.create(
                model="policy", messages=self.messages, tools=self.tools.schemas,
                max_tokens=self.agent.max_tokens, temperature=self.agent.temperature,
            )  # fmt: skip
            await self.act(response.choices[0].message.model_dump(exclude_none=True), response.usage.total_tokens)
        return self.outcome()

    async def act(self, message: dict, used_tokens: int) -> None:
        """Apply one assistant turn: run its tool calls (or nudge when it called none)."""
        self.turns += 1
        self.used, self.peak = used_tokens, max(self.peak, used_tokens)
        self.messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            self.messages.append({"role": "user", "content": f"Use a tool. {self._usage()}"})
            return
        pruning = all(c["function"]["name"] == "prune_chunks" for c in calls)
        self.prune_streak = self.prune_streak + 1 if pruning else 0
        self.max_prune_streak = max(self.max_prune_streak, self.prune_streak)
        for call in calls:
            name = call["function"]["name"]
            if self.used >= self.agent.budget and name not in ("prune_chunks", "answer"):
                result = "error: the context budget is reached; prune_chunks first"
            else:
                result, _ = await self.tools.call(name, call["function"]["arguments"])
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"{result}\n{self._usage()}"})

    def outcome(self) -> Outcome:
        text, doc_ids = self.final or ("", [])
        return Outcome(
            answer=text,
            success=answers_match(text, self.task.data.get("answer", "")),
            info={"doc_ids": list(doc_ids), "trajectory_doc_ids": list(self.seen_docs), "turns": self.turns,
                  "max_prune_streak": self.max_prune_streak, "peak_context": self.peak, "pruned": len(self.pruned)},
        )  # fmt: skip

    def _show(self, chunks: list[Chunk]) -> str:
        if not chunks:
            return "no new chunks"
        for c in chunks:
            if c.doc_id in self.pruned:  # pruned by its id, in context again with this chunk: prunable again by it
                self.pruned.remove(c.doc_id)
                self.pruned.update(x.id for x in self.agent.index.chunks_of(c.doc_id) if x.id in self.shown)
            self.shown[c.id] = None
            self._saw(c.doc_id)
        return "\n".join(f"[{c.id}] {c.text}" for c in chunks)

    def _document(self, doc_id: str) -> str:
        """A document read whole as `read_document` shows it (its paragraphs' line breaks kept): what pruning it
        deletes."""
        doc = self.agent.index.document(doc_id)
        return f"[{doc_id}] {doc.title + ': ' if doc.title else ''}{doc.text}"

    def _saw(self, doc_id: str) -> None:
        if doc_id not in self.seen_docs:
            self.seen_docs.append(doc_id)

    def _usage(self) -> str:
        line = f"[context: {self.used}/{self.agent.budget} tokens]"
        if self.used >= self.agent.budget:
            return line + " Budget reached: only prune_chunks and answer work now."
        if self.used > self.agent.budget / 2:
            # the oldest chunks still in context (not pruned, nor their document): the same in every process
            index = self.agent.index
            unpruned = [c for c in self.shown if c not in self.pruned and index.by_id[c].doc_id not in self.pruned][:4]
            return line + f" Over half the budget: consider prune_chunks({json.dumps(unpruned)})."
        return line


def _drop(content: str, entries: list[str]) -> str:
    """A tool result without `entries` (a chunk's line `[id] text`, or a document read whole with its paragraphs),
    each matched whole from the start of a line: a line of a document that looks like an entry (a footnote `[2]
    Smith, 1990.` in a corpus whose ids are numbers) is its text, neither the start of another entry nor the end of
    its own. The context usage line (`_usage`) stays."""
    lines, kept, at = content.split("\n"), [], 0
    parts = [entry.split("\n") for entry in entries]
    while at < len(lines):
        entry = next((p for p in parts if lines[at : at + len(p)] == p), None)
        if entry is None:
            kept.append(lines[at])
            at += 1
        else:
            at += len(entry)
    return "\n".join(kept)
