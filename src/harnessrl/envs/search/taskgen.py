"""Tasks from a user's own corpus (Context-1's pipeline): explore, write, verify, add distractors, split.

    harnessrl tasks --corpus corpus.jsonl --out tasks.jsonl [--generator gen.yaml] [--count N] [--hops 1,2]

1. **Explore**: a seed document and its neighbours, found through the same hybrid index (Chroma +
   BM25) the agent searches with.
2. **Write**: a question, its answer and supporting quotes. With `--generator` an LLM (any
   OpenAI-compatible endpoint, configured like the judge) writes them as JSON; without one the rule
   generator reads structured facts: `key: value` lines (and one-level JSON records, which are
   such lines too), asking "What is the KEY of TITLE?"; a value that is another document's title
   chains 2- and 3-hop questions ("... of the KEY1 of TITLE?").
3. **Verify**, dropping the task with its reason: output that does not parse; a quote not found word
   for word (whitespace aside) in the document it names; an answer no quote contains; an answer the
   question already gives away; a question asked before; fewer supporting documents than hops. "Contains"
   compares whole words of the normalised text: "no" is not in "nova".
4. **Distractors**: documents the index ranks close to the question that do not contain the answer
   (checked); a task without one is dropped.
5. **Split by document**: each document is train or test by a hash of its id (`test_share`); a
   task's split is that of its answer documents (every quoted document that contains the answer: a
   task whose answer documents are on both sides is dropped), and a train task that touches a test
   document is dropped, so no test answer document is ever seen in training.

Kept tasks are appended to the output as they pass (SearchTask lines with their `quotes`,
`distractor_doc_ids` and `hops`); `OUT.progress.json` holds the attempt counter, the drop counts and
the settings that decide the tasks (the corpus's hash, generator, hops, seed, test share), so a stopped
run resumes where it stopped, and a run with other settings is refused. The last line printed is
`{"requested", "kept", "dropped": {reason: n}, "hops": {"1": n, ...}}`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harnessrl.envs.search.data import Doc, Quote, SearchTask, normalise
from harnessrl.types import read_jsonl

DISTRACTORS = 2  # a task's distractor documents, at most
_FACT = re.compile(r"^\s*([^\W\d_][\w ]{0,40}?)\s*:\s*(\S.{0,200}?)\s*$")


class GeneratorConfig(BaseModel):
    """The LLM that writes tasks; the same fields as the judge's config."""

    model_config = ConfigDict(extra="forbid")
    base_url: str = Field(description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8001/v1")
    model: str = "generator"
    api_key_env: str = Field(default="HARNESSRL_GENERATOR_API_KEY", description="environment variable with the key")
    timeout: float = Field(default=120.0, gt=0)
    max_tokens: int = 512
    temperature: float = 0.7


class _WrittenQuote(BaseModel):
    """A quote as the generator returns it: keys beyond these (a "doc_title") are ignored, as in `_Written`."""

    model_config = ConfigDict(extra="ignore")
    doc_id: str = Field(min_length=1)
    text: str = Field(min_length=1)


class _Written(BaseModel):
    """What the generator must return (JSON)."""

    model_config = ConfigDict(extra="ignore")
    question: str = Field(min_length=5)
    answer: str = Field(min_length=1, max_length=200)
    quotes: list[_WrittenQuote] = Field(min_length=1)


@dataclass
class Draft:
    question: str
    answer: str
    quotes: list[Quote]
    hops: int


@dataclass
class Run:
    kept: list[SearchTask] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    hops: Counter = field(default_factory=Counter)
    attempts: int = 0
    settings: dict = field(default_factory=dict)  # what decides the tasks (run_settings): a resume must match


def doc_split(doc_id: str, test_share: float) -> str:
    digest = int(hashlib.sha256(doc_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if digest < test_share else "train"


def facts(doc: Doc) -> list[tuple[str, str, str]]:
    """(key, value, the line as written) for each `key: value` line, or each pair of a one-level JSON record."""
    text = doc.text.strip()
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            return _record_facts(record, text)
    found = []
    for line in text.splitlines():
        match = _FACT.match(line)
        if match and match[1].lower() not in ("http", "https", "note"):
            found.append((match[1].strip(), match[2].strip(), line.strip()))
    return found


def _record_facts(record: dict, text: str) -> list[tuple[str, str, str]]:
    """The record's string, number and boolean pairs; the quote is the pair as the document writes it (escapes
    and all, found by decoding the value that follows the key), the answer a string's value or a literal as written."""
    decoder, found = json.JSONDecoder(), []
    for key, value in record.items():
        if not isinstance(value, str | int | float):  # a bool is an int
            continue
        written_key = "|".join(re.escape(json.dumps(key, ensure_ascii=a)) for a in (True, False))
        for match in re.finditer(rf"(?:{written_key})\s*:\s*", text):
            try:
                parsed, end = decoder.raw_decode(text, match.end())
            except json.JSONDecodeError:
                continue
            if parsed == value:  # not the same key inside a nested object
                answer = value if isinstance(value, str) else text[match.end() : end]
                found.append((key, answer, text[match.start() : end]))
                break
    return found


def contains(text: str, part: str) -> bool:
    """`part` in `text` as whole words of their normalised forms: "no" is not in "nova"."""
    words = normalise(part)
    return bool(words) and f" {words} " in f" {normalise(text)} "


def quote_found(quote: str, text: str) -> bool:
    """Word for word, whitespace runs aside."""
    squash = lambda s: " ".join(s.split())  # noqa: E731
    return bool(quote.strip()) and squash(quote) in squash(text)


def verify(draft: Draft, docs: dict[str, Doc], seen: set[str]) -> str | None:
    """Why the draft must be dropped, or None."""
    for quote in draft.quotes:
        if quote.doc_id not in docs:
            return "quote_unknown_document"
        if not quote_found(quote.text, docs[quote.doc_id].text):
            return "quote_not_in_source"
    if not any(contains(q.text, draft.answer) for q in draft.quotes):
        return "answer_not_in_quotes"
    if contains(draft.question, draft.answer):
        return "answer_in_question"
    if len({q.doc_id for q in draft.quotes}) < draft.hops:
        return "too_few_documents_for_hops"
    if normalise(draft.question) in seen:
        return "duplicate_question"
    return None


class RuleWriter:
    """Questions from `key: value` facts; more hops through values that are other documents' titles."""

    identity = "rule"  # part of a run's settings

    def __init__(self, docs: list[Doc]):
        titles = Counter(normalise(d.title) for d in docs if d.title)
        self.shared = {t for t, n in titles.items() if n > 1}  # "Springfield" twice: which one a question means is open
        self.by_title = {normalise(d.title): d for d in docs if d.title and normalise(d.title) not in self.shared}

    def write(self, seed: Doc, neighbours: list[Doc], hops: int, rng: random.Random) -> Draft | str:
        own = facts(seed)
        if not own or not seed.title:
            return "no_structured_facts"
        if normalise(seed.title) in self.shared:  # another document of that title answers it otherwise
            return "ambiguous_title"
        if hops == 1:
            key, value, line = rng.choice(own)
            return Draft(f"What is the {key.lower()} of {seed.title}?", value, [Quote(doc_id=seed.id, text=line)], 1)
        doc, keys, quotes = seed, [], []
        for _ in range(hops - 1):  # follow a value that is another document's title, hops - 1 times
            chain = {doc.id, *(q.doc_id for q in quotes)}  # no document twice on the path
            links = [
                (k, line, self.by_title[normalise(v)]) for k, v, line in facts(doc) if normalise(v) in self.by_title
            ]
            links = [x for x in links if x[2].id not in chain and facts(x[2])]
            if not links:
                return "no_link_for_hops"
            key, line, target = rng.choice(links)
            keys.append(key.lower())
            quotes.append(Quote(doc_id=doc.id, text=line))
            doc = target
        key, value, line = rng.choice(facts(doc))
        path = "".join(f" of the {k}" for k in reversed(keys))
        return Draft(
            f"What is the {key.lower()}{path} of {seed.title}?", value, [*quotes, Quote(doc_id=doc.id, text=line)], hops
        )


class LLMWriter:
    """Asks an OpenAI-compatible model for {question, answer, quotes} over the seed and its neighbours."""

    def __init__(self, config: GeneratorConfig):
        import os

        import openai

        self.config = config
        # part of a run's settings: what writes the tasks, not where it is served (base_url) or how long it may take
        self.identity = f"{config.model} (temperature {config.temperature}, max_tokens {config.max_tokens})"
        self.client = openai.OpenAI(
            base_url=config.base_url, api_key=os.environ.get(config.api_key_env, "none"), timeout=config.timeout
        )

    def write(self, seed: Doc, neighbours: list[Doc], hops: int, rng: random.Random) -> Draft | str:
        shown = [seed, *neighbours[: max(0, hops - 1) + 1]]
        documents = "\n\n".join(f"[{d.id}] {d.title or ''}\n{d.text[:1500]}" for d in shown)
        prompt = (
            f"Documents:\n{documents}\n\nWrite one question that needs {hops} of these documents to answer "
            "(it must not contain the answer), its short answer, and a quote copied word for word from each "
            "document that supports it. Reply in exactly this form (or as JSON with the keys question, answer, "
            "quotes: [{doc_id, text}]):\nQuestion: ...\nAnswer: ...\nQuote [DOCUMENT ID]: ..."
        )
        try:
            reply = self.client.chat.completions.create(
                model=self.config.model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=self.config.max_tokens,
                temperature=self.config.temperature,
            )
        except Exception as exc:  # openai.APIError and transport errors: a recorded drop, not a crash
            return f"generator_error:{type(exc).__name__}"
        content = reply.choices[0].message.content if reply.choices else None  # no choice: a malformed reply
        written = _parse_written((content or "").strip(), seed.id)
        if written is None:
            return "malformed_output"
        quotes = [Quote(doc_id=q.doc_id, text=q.text) for q in written.quotes]
        return Draft(written.question.strip(), written.answer.strip(), quotes, hops)


# an id may hold "]": the id ends at the "]" that a ":" follows
_LINE = re.compile(r"^\s*(question|answer|quote)\s*(?:\[(.+?)\])?\s*:\s*(.+?)\s*$", re.I | re.M)


def _parse_written(text: str, default_doc: str) -> _Written | None:
    """The generator's reply as JSON, or as `Question: / Answer: / Quote [ID]:` lines (what small models
    manage); None when neither parses."""
    match = re.search(r"\{.*\}", text, re.S)
    try:
        return _Written.model_validate_json(match[0] if match else text)
    except (ValidationError, ValueError):
        pass
    fields: dict[str, list] = {"question": [], "answer": [], "quote": []}
    for key, doc_id, value in _LINE.findall(text):
        fields[key.lower()].append((doc_id.strip() or default_doc, value.strip().strip('"')))
    if not (fields["question"] and fields["answer"] and fields["quote"]):
        return None
    quotes = [_WrittenQuote(doc_id=doc, text=quote) for doc, quote in fields["quote"]]
    try:
        return _Written(question=fields["question"][0][1], answer=fields["answer"][0][1], quotes=quotes)
    except ValidationError:
        return None


def generate(
    docs: list[Doc],
    index,
    writer,
    count: int,
    hops: list[int],
    out: Path,
    seed: int = 0,
    test_share: float = 0.2,
    distractors: int = DISTRACTORS,
    max_attempts: int | None = None,
    progress=None,
    run: Run | None = None,
) -> Run:
    """Attempts until `count` tasks are kept (or `max_attempts`, default 20 x count); resumable from `out`. `run`:
    what `start` already returned for these settings (the CLI starts before it builds the index)."""
    by_id = {d.id: d for d in docs}
    run = run or start(out, run_settings(docs, writer, hops, seed, test_share, distractors))
    seen = {normalise(t.question) for t in run.kept}
    limit = max_attempts or 20 * count
    while len(run.kept) < count and run.attempts < limit:
        rng = random.Random(f"{seed}:{run.attempts}")  # each attempt its own stream: a resumed run repeats none
        run.attempts += 1
        task = _attempt(docs, by_id, index, writer, rng, rng.choice(hops), seen, test_share, distractors)
        if isinstance(task, str):
            run.dropped[task] += 1
        else:
            run.kept.append(task)
            run.hops[str(task.hops)] += 1
            seen.add(normalise(task.question))
            with open(out, "a", encoding="utf-8") as f:
                f.write(task.model_dump_json() + "\n")
        _save(run, out)
        if progress is not None:
            progress(len(run.kept), run.attempts)
    return run


def run_settings(
    docs: list[Doc], writer, hops: list[int], seed: int, test_share: float, distractors: int = DISTRACTORS
) -> dict:
    """What decides a run's tasks; a run resumed with other settings would mix tasks (a changed test share would
    put test answer documents in training)."""
    corpus = hashlib.sha256(json.dumps([[d.id, d.title, d.text] for d in docs]).encode()).hexdigest()
    return {"corpus_sha256": corpus, "generator": writer.identity, "hops": hops, "seed": seed,
            "test_share": test_share, "distractors": distractors}  # fmt: skip


class ProgressError(ValueError):
    """A resumed run's progress file that is not one `generate` wrote, or one of a run with other settings; the
    message names it."""


def _progress_path(out: Path) -> Path:
    return out.with_name(out.name + ".progress.json")


def start(out: Path, settings: dict) -> Run:
    """The run `out` holds (resumed when its progress file records the same `settings`), or a new one with an empty
    `out`. An `out` that is not ours is a FileExistsError, one that cannot be written (a folder, a missing folder)
    an OSError: `generate` starts here, and the CLI calls it before it builds the index too, to fail in seconds."""
    state_path = _progress_path(out)
    if out.is_file() and state_path.is_file():
        return _resumed(out, state_path, settings)
    if out.is_file() and out.stat().st_size:
        raise FileExistsError(
            f"{out}: exists and has no {state_path.name} (not ours to resume): remove it or pick --out"
        )
    out.write_text("")
    run = Run(settings=settings)
    _save(run, out)
    return run


def _save(run: Run, out: Path) -> None:
    state_path = _progress_path(out)
    tmp = state_path.with_name(state_path.name + ".tmp")  # replaced whole: a kill leaves the old state or the new
    state = {"attempts": run.attempts, "dropped": run.dropped, "hops": run.hops, "settings": run.settings}
    tmp.write_text(json.dumps(state))
    os.replace(tmp, state_path)


def _resumed(out: Path, state_path: Path, settings: dict) -> Run:
    """The run a killed `generate` left: its tasks (a last line cut by the kill is dropped, and the file mended) and
    its counters; a bad line elsewhere is a TraceLineError naming it, other settings a ProgressError naming them."""
    try:
        state = json.loads(state_path.read_text())
        attempts, dropped = int(state["attempts"]), Counter(state["dropped"])
    except (KeyError, TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ProgressError(
            f"{state_path}: not this run's progress ({exc}): remove it and {out} to start again"
        ) from None
    data = out.read_bytes()  # bytes: the kill may have cut a line inside a character
    if not data.endswith(b"\n"):  # it came while a task was being appended: that task is lost, not the file
        out.write_bytes(data := data[: data.rfind(b"\n") + 1])
    kept = read_jsonl(out, SearchTask) if data.strip() else []
    if attempts or kept:  # a run stopped before its first attempt (while the index was built) has nothing to mix
        _check_settings(state.get("settings"), settings, state_path, out)
    return Run(kept, dropped, Counter(str(t.hops) for t in kept), attempts, settings)  # hops: of the tasks kept


def _check_settings(then, now: dict, state_path: Path, out: Path) -> None:
    """A ProgressError naming the settings in which the run to resume (`then`) differs from this one (`now`)."""
    # A progress file written before runs recorded their settings is refused, not trusted: nothing shows that its
    # tasks were made with these settings, and a silent mix can put test answer documents in training.
    if not isinstance(then, dict):
        raise ProgressError(
            f"{state_path}: records no settings (an older harnessrl wrote it), so this run cannot be checked "
            f"against them: remove it and {out} to start again"
        )
    now = json.loads(json.dumps(now))  # as JSON holds them: lists, not tuples
    changed = sorted(k for k in then.keys() | now.keys() if then.get(k) != now.get(k))
    if changed:
        differences = "; ".join(f"{k}: {then.get(k)!r} then, {now.get(k)!r} now" for k in changed)
        raise ProgressError(
            f"{state_path}: the run to resume had other settings ({differences}): run with its settings, "
            f"or pick another --out"
        )


def _attempt(docs, by_id, index, writer, rng, hops, seen, test_share, distractors) -> SearchTask | str:
    seed_doc = rng.choice(docs)
    found = dict.fromkeys(c.doc_id for c in index.search(seed_doc.title or seed_doc.text[:200], k=6))
    neighbours = [by_id[i] for i in found if i != seed_doc.id]
    draft = writer.write(seed_doc, neighbours, hops, rng)
    if isinstance(draft, str):
        return draft
    reason = verify(draft, by_id, seen)
    if reason:
        return reason
    gold = list(dict.fromkeys(q.doc_id for q in draft.quotes))
    # the answer documents: every quoted one that holds the answer (verify made sure there is one)
    splits = {doc_split(q.doc_id, test_share) for q in draft.quotes if contains(q.text, draft.answer)}
    if len(splits) > 1:
        return "crosses_split"
    split = splits.pop()
    if split == "train" and any(doc_split(g, test_share) == "test" for g in gold):
        return "crosses_split"
    close = dict.fromkeys(c.doc_id for c in index.search(draft.question, k=10))
    picked = [i for i in close if i not in gold and not _holds(by_id[i], draft.answer)]
    if not picked:
        return "no_distractor"
    task_id = "gen-" + hashlib.sha256(normalise(draft.question).encode()).hexdigest()[:12]
    return SearchTask(
        id=task_id, question=draft.question, answer=draft.answer, gold_doc_ids=gold, split=split,
        quotes=draft.quotes, distractor_doc_ids=picked[:distractors], hops=draft.hops,
    )  # fmt: skip


def _holds(doc: Doc, answer: str) -> bool:
    """The answer in the document as the agent reads it, its title too (a record titled "Mara Quell" holds the mayor
    "Mara Quell" though its text never names her): a raw substring of the normalised forms, the stricter test."""
    return normalise(answer) in normalise(f"{doc.title or ''} {doc.text}")


def audit(tasks: list[SearchTask], docs: list[Doc]) -> dict:
    """Re-verify every task's quotes and answer against the corpus; the share that passes, and why not."""
    by_id = {d.id: d for d in docs}
    reasons = Counter(_audited(task, by_id) for task in tasks)
    passed = reasons.pop("ok", 0)
    return {
        "tasks": len(tasks),
        "passed": passed,
        "pass_share": round(passed / max(len(tasks), 1), 4),
        "failed": dict(reasons),
    }


def _audited(task: SearchTask, by_id: dict[str, Doc]) -> str:
    """Why the task fails the audit, or "ok"."""
    if any(g not in by_id for g in task.gold_doc_ids):  # `train` refuses the file
        return "gold_unknown_document"
    if not task.quotes:
        return "no_quotes"
    if any(q.doc_id not in task.gold_doc_ids for q in task.quotes):
        return "quote_outside_gold"
    reason = verify(Draft(task.question, task.answer, task.quotes, task.hops), by_id, set())
    if reason:
        return reason
    if any(d not in by_id for d in task.distractor_doc_ids):
        return "distractor_unknown_document"
    if any(_holds(by_id[d], task.answer) for d in task.distractor_doc_ids):
        return "distractor_contains_answer"  # its title too, as when distractors are picked
    return "ok"


ANSWERABLE = (
    "Score 1 when the answer is correct for the question and follows from the supporting passages alone, "
    "and the question is clear; 0 otherwise."
)


async def answerability(tasks: list[SearchTask], judge) -> dict:
    """A judge (rewards.judge.Judge) scores each task's answer against its question and quotes."""
    import asyncio

    from harnessrl.types import Episode, Outcome, Task

    slots = asyncio.Semaphore(8)

    async def score(task: SearchTask) -> float | None:
        passages = "\n".join(f"[{q.doc_id}] {q.text}" for q in task.quotes)
        episode = Episode(task=Task(prompt=f"Question: {task.question}\nSupporting passages:\n{passages}"),
                          outcome=Outcome(answer=task.answer))  # fmt: skip
        async with slots:
            try:
                return await judge.pointwise(episode)
            except Exception:  # a judge that failed is counted, never a 0
                return None

    scores = await asyncio.gather(*(score(t) for t in tasks))
    judged = [s for s in scores if s is not None]
    return {
        "judged": len(judged),
        "judge_failures": len(scores) - len(judged),
        # null where nothing was judged (an unreachable judge): no share, not 0 answerable
        "answerable_share": round(sum(s >= 0.5 for s in judged) / len(judged), 4) if judged else None,
    }
