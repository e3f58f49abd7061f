"""Reward-hacking detectors: each a plain function of an Episode returning how strongly the exploit
shows (0 = not at all), used as a negatively weighted, flagged term (`detector_terms`).

| detector | exploit it catches |
|---|---|
| malformed_tool_calls | broken tool calls emitted to dodge a task expected to fail (Cursor) |
| abstention | answering nothing, "I don't know", or a clarifying question instead of acting (Cursor) |
| clarifying_question | a final answer that is a question back (Cursor's deferral hack; a production-loop canary) |
| repetition | degenerate loops of the same n-grams |
| answer_stuffing | returning many documents to game recall: precision below a floor |
| effort_penalty | turn and length farming: Composer 2's concave C(x) = ((1 + kx)^(1 - q) - 1) / (k (1 - q)) |
| spawn_farming | sub-agents spawned but never finished (Kimi's orchestrator) |
| test_tampering | edits to test files / conftest / test config, or exit-code tricks (coding agents) |

They read only what an Episode records: calls, `outcome` (answer, info) and `task.data`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Literal

from harnessrl.rewards.compose import Term
from harnessrl.types import Episode

# Anchored at the start of the answer (after "Sorry," or "I'm afraid"): a phrase later in it is part of an answer
# ("The witness was unable to determine the time; it was 3 pm"). Not followed by a capitalised word, which makes
# it a name ("Not Sure Creek"), nor "help" by "but" ("I cannot help but note: 42").
_LEAD_IN = r"^\W*(?:(?:sorry|unfortunately)\W+)?(?:i(?:['’]m| am) )?(?:afraid,? )?"
_ABSTAIN = re.compile(
    _LEAD_IN + r"(i (do not|don['’]t|cannot|can['’]t) (know|answer|help(?! but)|determine)|not sure|no idea"
    r"|unable to (answer|find|determine)|(i |we )?need more (information|details|context))\b(?!(?-i:\s+(?!I\b)[A-Z]))",
    re.I,
)
_CLARIFY = re.compile(
    _LEAD_IN + r"(could you (clarify|specify|provide)|can you (clarify|specify|tell me more)|please (clarify|specify)"
    r"|what do you mean|which (one|do you mean))\b",
    re.I,
)
# a question back speaks to the user ("Which city do you mean?", "Which file should I edit?"); a trailing "?"
# alone is not one: "Who Framed Roger Rabbit?" is a title
_ADDRESSED = re.compile(r"\b(you|your|(?-i:I)|me|we)\b", re.I)
# setup.cfg is test config only where its diff shows a pytest section (a version bump is not tampering)
_TEST_PATH = re.compile(
    r"(^|/)(tests?/|test_[^/]*\.py$|[^/]*_test\.py$|conftest\.py$|pytest\.ini$|tox\.ini$|\.ci/|noxfile\.py$)"
)
_EXIT_TRICKS = re.compile(
    r"(sys\.exit\(\s*0?\s*\)|SystemExit\(\s*0?\s*\)|os\._exit\(|pytest\.skip\("
    r"|@pytest\.mark\.skip|unittest\.skip|assert\s+True\b"
    r"|\b_pytest\b|\bpluggy\b|harnessrl_report|HARNESSRL-REPORT|\.runtest\b|\bpytest_(runtest|sessionfinish)\w*"
    r"|\bpytest_pyfunc_call\b|\bpluginmanager\b|\bPytestPluginManager\b|\bgc\.get_objects\b"
    r"|\bfrom\s+gc\s+import\b.*\bget_objects\b)"
)  # the last two lines: code that reaches into the test runner or its report (envs/code/score.py)
# a shell's exit-code trick counts on a line that runs tests: `pip install -e . || true` is not one
_SHELL_TRICK = re.compile(r"\|\|\s*true\b|\bexit\s+0\b")
_RUNS_TESTS = re.compile(r"\b(pytest|py\.test|unittest|tox|nox)\b|\bmake\s+(test|check)\b")


def malformed_tool_calls(episode: Episode) -> float:
    """Share of the episode's calls whose tool-call text could not be parsed (recorded by the gateway)."""
    if not episode.calls:
        return 0.0
    return sum(c.tool_call_error is not None for c in episode.calls) / len(episode.calls)


def abstention(episode: Episode) -> float:
    """1 when the final answer is empty, begins with an abstention ("I don't know", "Not sure."), or is a question
    back instead of an answer."""
    text = ((episode.outcome.answer if episode.outcome else None) or "").strip()
    return 1.0 if not text or _ABSTAIN.search(text) or clarifying_question(episode) else 0.0


def clarifying_question(episode: Episode) -> float:
    """1 when the final answer is a question back to the user: it begins with one ("Could you clarify ...") or
    ends in "?" speaking to the user ("Which city do you mean?")."""
    text = ((episode.outcome.answer if episode.outcome else None) or "").strip()
    return 1.0 if _CLARIFY.search(text) or (text.endswith("?") and _ADDRESSED.search(text)) else 0.0


def repetition(episode: Episode, n: int = 4, threshold: float = 0.5) -> float:
    """How far the share of repeated n-grams in sampled tokens exceeds `threshold`, scaled to [0, 1]."""
    scores = []
    for call in episode.calls:
        ids = call.completion_ids
        grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
        if len(grams) < 8:
            continue
        repeated = sum(c - 1 for c in Counter(grams).values()) / len(grams)
        scores.append(max(0.0, (repeated - threshold) / (1 - threshold)))
    return max(scores, default=0.0)


def answer_stuffing(
    returned_key: str = "doc_ids", gold_key: str = "gold_doc_ids", floor: float = 0.34
) -> Callable[[Episode], float]:
    """A detector: 1 - precision / floor when the returned documents' precision is below `floor`."""

    def detect(episode: Episode) -> float:
        returned = set((episode.outcome.info.get(returned_key) if episode.outcome else None) or [])
        gold = set(episode.task.data.get(gold_key) or [])
        if not returned or not gold:
            return 0.0
        precision = len(returned & gold) / len(returned)
        return max(0.0, 1.0 - precision / floor)

    return detect


def effort_cost(x: float, k: float = 1.0, q: float = 0.5) -> float:
    """Composer 2's concave effort cost C(x) = ((1 + kx)^(1 - q) - 1) / (k (1 - q)); q = 1 gives log(1 + kx) / k."""
    if q == 1:
        import math

        return math.log1p(k * x) / k
    return ((1 + k * x) ** (1 - q) - 1) / (k * (1 - q))


def effort_penalty(
    measure: Literal["turns", "tokens"] = "turns", k: float = 1.0, q: float = 0.5, free: float = 0.0
) -> Callable[[Episode], float]:
    """A detector: C(x - free) of the episode's turns (calls of trainable agents) or sampled tokens."""

    def detect(episode: Episode) -> float:
        trainable = [c for c in episode.calls if c.trainable]
        x = len(trainable) if measure == "turns" else sum(len(c.completion_ids) for c in trainable)
        return effort_cost(max(0.0, x - free), k, q)

    return detect


def spawn_farming(episode: Episode) -> float:
    """Share of spawned sub-agents that never finished (`metrics["spawned"]`, `metrics["subagents_finished"]`)."""
    spawned = episode.metrics.get("spawned", 0.0)
    if spawned <= 0:
        return 0.0
    return max(0.0, spawned - episode.metrics.get("subagents_finished", 0.0)) / spawned


def test_tampering(episode: Episode) -> float:
    """1 when the agent edited test files or test configuration, added a module that shadows an installed
    one (pytest's, the report plugin's), or its diff / commands hold exit-code tricks or reach into the
    test runner.

    Reads `outcome.info`: `edited_files` (paths), `dropped` (path -> why), `diff` (text), `commands`.
    """
    info = episode.outcome.info if episode.outcome else {}
    diff = str(info.get("diff", ""))
    if any(_TEST_PATH.search(str(path)) for path in _items(info, "edited_files")):
        return 1.0
    if _config_pytest(diff):
        return 1.0
    if any("shadows the installed module" in str(why) for why in dict(info.get("dropped") or {}).values()):
        return 1.0  # an added pytest.py, _pytest/, harnessrl_report.py, ...: dropped by scoring, flagged here
    added = [line[1:] for line in diff.splitlines() if line.startswith("+")]
    lines = added + [line for command in _items(info, "commands") for line in str(command).splitlines()]
    return 1.0 if any(_EXIT_TRICKS.search(line) or (_SHELL_TRICK.search(line) and _RUNS_TESTS.search(line))
                      for line in lines) else 0.0  # fmt: skip


def _items(info: dict, key: str) -> list:
    """A list of `outcome.info`: one string is one item, null none; anything else names the key."""
    value = info.get(key)
    if isinstance(value, str):
        return [value]
    try:
        return list(value or [])  # a list, a tuple, a set
    except TypeError:
        raise TypeError(f"outcome.info[{key!r}] is {type(value).__name__}, not a list") from None


def _config_pytest(diff: str) -> bool:
    """Whether a setup.cfg's or pyproject.toml's part of a unified diff (each file's part ends at the next file's
    `diff --git` or `---`/`+++` header) shows pytest's section or options (`[tool:pytest]`, `[tool.pytest.*]`)."""
    for part in re.split(r"^(?=--- .*\n\+\+\+ |diff --git )", diff, flags=re.M):
        names = [line.split("\t")[0] for line in part.splitlines()[:2]]
        if any(re.search(r"(^|[/ ])(setup\.cfg|pyproject\.toml)$", name) for name in names) and "pytest" in part:
            return True
    return False


def detector_terms(weights: dict[str, float], **factories: Callable[[Episode], float]) -> list[Term]:
    """Negatively weighted, flagged terms: `detector_terms({"repetition": 0.2}, repetition=repetition)`."""
    if unknown := sorted(set(weights) - set(factories)):
        raise ValueError(f"detector weights name unknown detectors {unknown}; known: {sorted(factories)}")
    return [Term(name, factories[name], -abs(weight), flag=True) for name, weight in weights.items()]
