"""Wide tasks from any search task set: N questions of one split bundled into one task.

Questions are bundled with others of the same shape where there are enough ("What was the
occupation of A?", "... of B?": for each of these entities, find one attribute), else with any of
the split, so a user's own tasks.jsonl works as it is. A wide task keeps each item's question,
answer and gold documents; the split is kept, so no test question is ever seen in training.
`bundlings` > 1 bundles the train split that many times, each time drawn anew (other companions,
another order): more distinct demonstrations and RL tasks from the same questions; the test split
is bundled once. `set_aside` holds train questions out for a validation split (or for RL alone).
"""

from __future__ import annotations

import random
import re

from harnessrl.envs.search.data import SearchTask
from harnessrl.types import Task

PROMPT = "Answer each question below. Give them to sub-agents, then answer with one answer per question, by number."


def shape(question: str) -> str:
    """The question without its names (capitalised words after the first) and numbers."""
    first, *rest = question.split()
    return " ".join([first, *(w for w in rest if not re.match(r"^[A-Z0-9]", w))])


def wide_tasks(
    items: list[SearchTask], width: int, seed: int = 0, bundlings: int = 1, name: str | None = None
) -> list[Task]:
    """Every test question in exactly one wide task of `width` items (the last of a split may be
    smaller; a last one of a single question is left out: nothing to hand out side by side); every
    train question in `bundlings` of them. Each bundling of each split draws from its
    own random state, so the test tasks depend only on the test questions, `width` and `seed`. Task
    ids are `wide-<split>-N[-bundling]`, or `wide-<name>-N` with `name` (for items of one split: the ids of two
    would collide, and evaluation pairs episodes by task id)."""
    if name is not None and len({t.split for t in items}) > 1:
        raise ValueError(f"wide_tasks(name={name!r}): items of both splits would share task ids")
    out = []
    for split, bundling in [("train", 0), ("test", 0)] + [("train", b) for b in range(1, bundlings)]:
        rng = random.Random(f"{seed}:{split}:{bundling}")
        pool = [t for t in items if t.split == split]
        rng.shuffle(pool)
        pool.sort(key=lambda t: shape(t.question))  # same-shape questions side by side, shuffled within
        for start in range(0, len(pool), width):
            chunk = pool[start : start + width]
            if len(chunk) < 2:
                continue
            questions = "\n".join(f"{i + 1}. {t.question}" for i, t in enumerate(chunk))
            out.append(Task(
                id=f"wide-{name or split}-{start // width}" + (f"-{bundling}" if bundling else ""),
                prompt=f"{PROMPT}\n{questions}",
                split=split,
                data={"questions": [t.question for t in chunk], "answers": [t.answer for t in chunk],
                      "gold_doc_ids": [t.gold_doc_ids for t in chunk], "item_ids": [t.id for t in chunk]},
            ))  # fmt: skip
    return out


def set_aside(
    items: list[SearchTask], questions: int, seed: int = 0, purpose: str = "validation"
) -> tuple[list[SearchTask], list[SearchTask]]:
    """(the rest, `questions` train questions drawn at random for `purpose`): e.g. a validation split
    whose questions no training task holds, whatever the bundlings."""
    train = [t for t in items if t.split == "train"]
    held = {t.id for t in random.Random(f"{seed}:{purpose}").sample(train, min(questions, len(train)))}
    return [t for t in items if t.id not in held], [t for t in items if t.id in held]
