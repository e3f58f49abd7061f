"""Search corpora and tasks: JSONL files a user brings, or a deterministic synthetic generator.

corpus.jsonl: {"id", "text", "title"?}      tasks.jsonl: {"id", "question", "answer", "gold_doc_ids", "split",
                                                         "quotes"?, "distractor_doc_ids"?, "hops"?, "family"?}

The generator writes small encyclopaedia entries about invented people, towns and countries, with
distractors that share names and attribute types, and 1-3 hop questions whose gold documents are
the entries on the chain. It is a test bed, not a target: nothing else may be tuned to it.
"""

from __future__ import annotations

import itertools
import random
import re
import unicodedata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harnessrl.types import Task, read_jsonl, read_jsonl_numbered  # noqa: F401 (read_jsonl: imported from here)


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    title: str | None = None

    @field_validator("text")
    @classmethod
    def _written(cls, v: str) -> str:
        if not v.strip():  # nothing to find or read: the index would hold an empty chunk
            raise ValueError("is blank")
        return v


class Quote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    doc_id: str = Field(min_length=1)
    text: str = Field(min_length=1, description="copied word for word from the document")


class SearchTask(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answer: str = Field(min_length=1)
    gold_doc_ids: list[str] = Field(min_length=1)
    split: Literal["train", "test"]
    # written by `harnessrl tasks` (taskgen.py); optional in a user's own file
    quotes: list[Quote] = Field(default_factory=list, description="supporting passages, verified verbatim")
    distractor_doc_ids: list[str] = Field(default_factory=list, description="close documents without the answer")
    hops: int = Field(default=1, ge=1, le=3)
    family: str | None = Field(
        default=None,
        min_length=1,
        description="the task's kind, e.g. its question template: eval reports success per family",
    )

    @field_validator("gold_doc_ids")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) < len(v):  # a document counted twice: recall could never reach 1, hop counts read one too many
            raise ValueError(f"names {next(d for d in v if v.count(d) > 1)!r} twice")
        return v

    @field_validator("question")
    @classmethod
    def _asked(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("is blank")
        return v

    @field_validator("answer")
    @classmethod
    def _answerable(cls, v: str) -> str:
        if not normalise(v):  # every reply would match it, the empty one too
            raise ValueError("has no letter or digit: no reply could be told right or wrong against it")
        return v

    def task(self) -> Task:
        data = {"answer": self.answer, "gold_doc_ids": self.gold_doc_ids}
        if self.family:
            data["family"] = self.family
        return Task(id=self.id, prompt=self.question, data=data, split=self.split)


class DataError(ValueError):
    """Lines that validate one by one but not together (duplicate ids, unknown gold documents)."""


def load_corpus(corpus: Path) -> list[Doc]:
    """The corpus's documents, or DataError naming a document id that two lines share."""
    numbered = read_jsonl_numbered(corpus, Doc)
    seen: dict[str, int] = {}
    for number, doc in numbered:
        if doc.id in seen:
            raise DataError(
                f"{corpus}: document id {doc.id!r} on lines {seen[doc.id]} and {number}: ids must be unique"
            )
        seen[doc.id] = number
    return [doc for _, doc in numbered]


def load(corpus: Path, tasks: Path) -> tuple[list[Doc], list[SearchTask]]:
    docs, numbered = load_corpus(corpus), read_jsonl_numbered(tasks, SearchTask)
    items = [t for _, t in numbered]
    ids = {d.id for d in docs}
    lines: dict[str, int] = {}
    for number, t in numbered:  # evaluation pairs by task id; guidance finds demos by it
        if t.id in lines:
            raise DataError(f"{tasks}: task id {t.id!r} on lines {lines[t.id]} and {number}: ids must be unique")
        lines[t.id] = number
    for t in items:
        missing = [g for g in t.gold_doc_ids if g not in ids]
        if missing:
            raise DataError(f"{tasks}: task {t.id}: gold_doc_ids not in the corpus: {missing}")
    return docs, items


def write_jsonl(path: Path, rows: list[BaseModel]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r.model_dump_json(exclude_defaults=True) + "\n" for r in rows), encoding="utf-8")


_SYLLABLES = [
    "ka",
    "lo",
    "mir",
    "ven",
    "dra",
    "sul",
    "tho",
    "bre",
    "ni",
    "qua",
    "rel",
    "os",
    "tam",
    "ur",
    "zel",
    "fin",
    "gar",
    "hal",
]
_JOBS = [
    "baker",
    "sailor",
    "painter",
    "surveyor",
    "clockmaker",
    "weaver",
    "astronomer",
    "miller",
    "scribe",
    "glassblower",
]
_CROPS = ["barley", "olives", "rye", "apples", "flax", "grapes", "millet", "hops"]


_DETAILS = [
    "{n} is known for its {adj} {thing}.",
    "Travellers remember {n} for a {adj} {thing}.",
    "Records about {n} mention a {adj} {thing} in {year}.",
    "Stories from {n} speak of a {adj} {thing}.",
]
_ADJ = ["old", "narrow", "painted", "famous", "quiet", "crooked", "tall", "green", "stone", "wooden"]
_THING = ["bridge", "market", "well", "tower", "garden", "library", "mill", "harbour", "gate", "chapel"]


def synthetic(
    seed: int = 0, people: int = 120, towns: int = 40, countries: int = 12, test_share: float = 0.25, details: int = 0
) -> tuple[list[Doc], list[SearchTask]]:
    """A deterministic corpus (people, towns, countries) and 1-3 hop questions about it.

    `details` > 0 appends that many filler sentences to every document (longer chunks, for
    benchmarks about context size); the questions never ask about them.
    """
    rng = random.Random(seed)
    used: set[str] = set()

    def name_part(parts: int) -> str:
        return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()

    def name(parts: int) -> str:
        while True:
            if (n := name_part(parts)) not in used:
                used.add(n)
                return n

    country = [
        {"id": f"country-{i}", "name": name(3), "capital": None, "founded": rng.randint(800, 1900)}
        for i in range(countries)
    ]
    town = [
        {"id": f"town-{i}", "name": name(2), "country": rng.choice(country), "crop": rng.choice(_CROPS)}
        for i in range(towns)
    ]
    for c in country:
        c["capital"] = rng.choice([t for t in town if t["country"] is c] or town)
    places = set(used)
    names = len({"".join(p).capitalize() for p in itertools.product(_SYLLABLES, repeat=2)} - places) ** 2
    if people > names:  # person_name would draw forever
        raise ValueError(f"{people} is more than the {names} distinct names the generator has (seed {seed})")

    def person_name() -> str:  # unique as a whole; neither part is a place's name
        while True:
            first, last = (name_part(2) for _ in range(2))
            if f"{first} {last}" not in used and not {first, last} & places:
                used.add(f"{first} {last}")
                return f"{first} {last}"

    person = [
        {
            "id": f"person-{i}",
            "name": person_name(),
            "town": rng.choice(town),
            "job": rng.choice(_JOBS),
            "born": rng.randint(1700, 1990),
        }
        for i in range(people)
    ]

    docs = [
        Doc(
            id=c["id"],
            title=c["name"],
            text=f"{c['name']} is a country founded in {c['founded']}. Its capital is {c['capital']['name']}.",
        )
        for c in country
    ]
    docs += [
        Doc(
            id=t["id"],
            title=t["name"],
            text=f"{t['name']} is a town in {t['country']['name']}. The fields around {t['name']} grow {t['crop']}.",
        )
        for t in town
    ]
    docs += [
        Doc(
            id=p["id"],
            title=p["name"],
            text=f"{p['name']} was a {p['job']} born in {p['born']} in the town of {p['town']['name']}.",
        )
        for p in person
    ]

    if details:
        filler = random.Random(f"{seed}:details")
        for doc in docs:
            name = doc.title or doc.id
            extra = (
                filler.choice(_DETAILS).format(
                    n=name, adj=filler.choice(_ADJ), thing=filler.choice(_THING), year=filler.randint(1500, 1990)
                )
                for _ in range(details)
            )
            doc.text = " ".join([doc.text, *extra])
    tasks = []
    for i, p in enumerate(person):
        hops = 1 + i % 3
        t, c = p["town"], p["town"]["country"]
        if hops == 1:
            q, a, family = rng.choice(
                [
                    (f"What was the occupation of {p['name']}?", p["job"], "occupation"),
                    (f"In which year was {p['name']} born?", str(p["born"]), "birth_year"),
                ]
            )
            gold = [p["id"]]
        elif hops == 2:
            q, a, family = rng.choice(
                [
                    (f"In which country was {p['name']} born?", c["name"], "birth_country"),
                    (f"What do the fields grow around the birthplace of {p['name']}?", t["crop"], "birthplace_crop"),
                ]
            )
            gold = [p["id"], t["id"]]
        else:
            q, a, family = (
                f"What is the capital of the country where {p['name']} was born?",
                c["capital"]["name"],
                "birth_country_capital",
            )
            gold = [p["id"], t["id"], c["id"]]
        split = "test" if rng.random() < test_share else "train"
        tasks.append(SearchTask(id=f"q-{i}", question=q, answer=a, gold_doc_ids=gold, split=split, family=family))
    return docs, tasks


def write_corpus(folder: Path, docs: list[Doc], tasks: list[SearchTask]) -> tuple[Path, Path]:
    """`folder/corpus.jsonl` and `folder/tasks.jsonl`, the files `harnessrl train --corpus --tasks` reads."""
    write_jsonl(folder / "corpus.jsonl", docs)
    write_jsonl(folder / "tasks.jsonl", tasks)
    return folder / "corpus.jsonl", folder / "tasks.jsonl"


def dump_synthetic(folder: Path, seed: int = 0) -> tuple[Path, Path]:
    return write_corpus(folder, *synthetic(seed))


def normalise(text: str) -> str:
    """NFKC and case folded (full-width digits, a decomposed ü, ß as ss compare as their plain forms); a dash or
    U+2212 read as "-"; punctuation made a space (Jean-Luc is Jean Luc) but for apostrophes, which join (O'Brien), a
    + or # ending a word (C++ is not C),
    and the marks that make a number: its sign, its thousands separators (dropped: 1,000 and 1 000 are 1000) and a
    . / : - between digits (3.14, 1/2, 3:45, 2-3 are not 314, 12, 345, 23); whitespace runs made one space."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join("-" if ch == "\u2212" or unicodedata.category(ch) == "Pd" else ch for ch in text)
    text = _THOUSANDS.sub(lambda m: re.sub("[, ]", "", m[0]), text)
    marks = {m.start() for m in _NUMBER_MARK.finditer(text)}
    kept = (ch if _in_word(ch) or i in marks or _language_mark(text, i) else "" if ch in "'\u2019" else " "
            for i, ch in enumerate(text))  # fmt: skip
    return " ".join("".join(kept).split())


def _language_mark(text: str, i: int) -> bool:
    """A + or # in a run of them after a letter that ends the word (C++, C#, F#): part of it, or "C" would match
    "C++"; not 5+3 or a+b, which read as 5 3 and a b as before."""
    if text[i] not in "+#":
        return False
    start, end = i, i
    while start > 0 and text[start - 1] in "+#":
        start -= 1
    while end < len(text) and text[end] in "+#":
        end += 1
    return start > 0 and text[start - 1].isalpha() and (end == len(text) or not _in_word(text[end]))


def _in_word(ch: str) -> bool:
    return ch.isalnum() or unicodedata.category(ch).startswith("M")  # a combining mark: part of its letter


_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}([, ])\d{3}(?:\1\d{3})*(?!\d|\1\d)")  # 1,000,000 or 1 000 000
_NUMBER_MARK = re.compile(r"(?<=\d)[./:-](?=\d)|(?<![\w.])-(?=\d)")


def answers_match(given: str | None, expected: str) -> bool:
    """Normalised comparison (`normalise`): case, Unicode forms, punctuation and spacing ignored, a number's marks not."""
    return given is not None and normalise(given) == normalise(expected) != ""
