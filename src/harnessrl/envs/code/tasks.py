"""Coding tasks on disk: one folder per task, the format both the generator and a user's own tasks use.

    TASK/
      task.json   {"id", "issue", "test_command", "visible_tests", "target_tests", "difficulty", "impossible", ...}
      repo/       the project as the agent first sees it (its visible tests inside)
      hidden/     the hidden tests, laid over a pristine copy of repo/ at scoring (same relative paths)
      reference/  optional: the fixed files (same relative paths), for the scripted expert's demonstrations

`test_command` is a pytest command line (argv) run from the project root; the visible tests are
its arguments in the agent's runs, the hidden files in the scoring run. `target_tests` names the
hidden tests the reward counts (empty: all of them); the other hidden tests guard against
regressions. Only `id` and `issue` are required: a user's repository with `hidden/tests/...` and
an issue text is a task. Nothing but repo/ (copied) is ever mounted where the agent's commands run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harnessrl.envs.code.sandbox import WORKSPACE_MB, listing
from harnessrl.types import Task, first_error

# paths that configure or hold tests: never taken from the agent's workspace into the scoring copy
TEST_PATH = re.compile(
    r"(^|/)(tests?/|test_[^/]*\.py$|[^/]*_test\.py$|conftest\.py$|pytest\.ini$|tox\.ini$|setup\.cfg$|pyproject\.toml$"
    r"|(site|user)customize\.[^/]*$|[^/]*\.pth$|\.pytest_cache/|__pycache__/)"
)


class TaskFormatError(ValueError):
    """A task folder that does not load: the message names the file and the field."""


class CodeTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="stable task id")
    issue: str = Field(description="the issue text the agent is given")
    test_command: list[str] = Field(
        default_factory=lambda: ["python", "-m", "pytest"], min_length=1, description="a pytest argv"
    )
    visible_tests: list[str] = Field(default_factory=lambda: ["tests"], description="paths in repo/ the agent may run")
    target_tests: list[str] = Field(
        default_factory=list, description="hidden test function names the reward counts; empty: every hidden test"
    )
    difficulty: Literal["easy", "hard"] | None = Field(
        default=None, description="easy: a visible test fails before the fix"
    )
    impossible: bool = Field(default=False, description="the hidden tests contradict the issue (a cheat canary)")
    split: Literal["train", "test"] | None = None
    lines_changed: int | None = Field(default=None, description="lines the reference fix changes")
    source: dict[str, str] = Field(default_factory=dict, description="provenance: module, function, mutation")

    def task(self, folder: Path) -> Task:
        """The harness's Task: the prompt is the issue; the folder travels in `data`."""
        data = {"task_dir": str(folder.resolve()), "impossible": self.impossible, "difficulty": self.difficulty}
        return Task(id=self.id, prompt=self.issue, data=data, split=self.split)


def load_task(folder: Path) -> CodeTask:
    spec = folder / "task.json"
    if not spec.is_file():
        raise TaskFormatError(f"{spec}: missing")
    try:
        task = CodeTask.model_validate_json(spec.read_text())
    except ValidationError as exc:
        raise TaskFormatError(f"{spec}: {first_error(exc, 'file')}") from None
    for part in ("repo", "hidden"):
        if not (folder / part).is_dir():
            raise TaskFormatError(f"{folder / part}: missing (a task folder has task.json, repo/ and hidden/)")
    if (
        size := sum(n for n, _ in listing(folder / "repo").values())
    ) > WORKSPACE_MB * 1024**2:  # each episode copies it, its runs may add the cap
        raise TaskFormatError(f"{folder / 'repo'}: {size} bytes, over the {WORKSPACE_MB} MiB a workspace may hold")
    if conftest := sorted((folder / "hidden").rglob("conftest.py")):
        raise TaskFormatError(
            f"{conftest[0]}: scoring runs pytest with --noconftest (an agent's conftest.py would run first), so its"
            " fixtures would never load: put them in the test files"
        )
    tests = hidden_test_kinds(folder)
    if not tests:
        raise TaskFormatError(f"{folder / 'hidden'}: no test functions (test_*) in any .py file")
    if unknown := sorted(set(task.target_tests) - set(tests)):
        raise TaskFormatError(f"{spec}: target_tests: not among the hidden tests: {unknown}")
    if coroutines := sorted(t for t in task.target_tests if tests[t]):
        raise TaskFormatError(
            f"{spec}: target_tests: {coroutines} are async def: scoring loads no asyncio plugin, so pytest skips"
            " them and they could never pass"
        )
    return task


def load_tasks(root: Path) -> list[tuple[CodeTask, Path]]:
    """Every task folder directly under `root` (sorted by name); their ids are unique (episodes pair by id)."""
    folders = sorted(p for p in Path(root).iterdir() if (p / "task.json").is_file())
    if not folders:
        raise TaskFormatError(f"{root}: no task folders (each holds a task.json)")
    loaded, seen = [(load_task(f), f) for f in folders], {}
    for task, folder in loaded:
        if (first := seen.setdefault(task.id, folder)) != folder:
            raise TaskFormatError(f"{folder / 'task.json'}: id: {task.id!r} is also {first}'s: ids must be unique")
    return loaded


def hidden_test_names(folder: Path) -> set[str]:
    """The hidden tests' names as the report names them (`test_b` for `TestA::test_b`, parameters dropped):
    `test*` functions, plain or async, at the top level of each .py file, in its `Test*` classes (nested
    ones too) and in its unittest.TestCase subclasses of any name, read without running anything."""
    return set(hidden_test_kinds(folder))


def hidden_test_kinds(folder: Path) -> dict[str, bool]:
    """`hidden_test_names`, each with whether it is an `async def` (True where any test of that name is)."""
    tests: dict[str, bool] = {}
    for path in (folder / "hidden").rglob("*.py"):
        try:  # bytes: the file's own encoding declaration counts, as when pytest imports it
            module = ast.parse(path.read_bytes(), filename=str(path))
        except SyntaxError as exc:  # invalid UTF-8 too
            raise TaskFormatError(f"{path}:{exc.lineno}: {exc.msg}") from None
        except ValueError as exc:  # a null byte (before Python 3.12)
            raise TaskFormatError(f"{path}: {exc}") from None
        for name, coroutine in _tests(module.body):
            tests[name] = tests.get(name, False) or coroutine
    return tests


def _tests(body: list[ast.stmt]) -> list[tuple[str, bool]]:
    """What pytest collects from a module's or class's body: `test*` functions (not fixtures) and the tests of its
    `Test*` classes (not one with an `__init__`, which pytest skips) and unittest.TestCase subclasses (whatever their
    names), with those inherited from classes beside them."""
    classes = {node.name: node for node in body if isinstance(node, ast.ClassDef)}
    found = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            if not any(_name(d.func if isinstance(d, ast.Call) else d) == "fixture" for d in node.decorator_list):
                found.append((node.name, isinstance(node, ast.AsyncFunctionDef)))
        elif isinstance(node, ast.ClassDef):
            family = [node, *_bases(node, classes)]
            if any(_name(b).endswith("TestCase") for c in family for b in c.bases):
                found += [test for c in family for test in _tests(c.body)]
            elif node.name.startswith("Test") and not any(_defines(c, "__init__", "__new__") for c in family):
                found += [test for c in family for test in _tests(c.body)]
    return found


def _name(node: ast.expr) -> str:
    """The name a base class or decorator is written with (`TestCase`, `unittest.TestCase`: both `TestCase`)."""
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def _defines(node: ast.ClassDef, *names: str) -> bool:
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name in names for n in node.body)


def _bases(node: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> list[ast.ClassDef]:
    """The classes beside `node` it derives from, directly or not (a base imported from elsewhere is not read)."""
    found: list[ast.ClassDef] = []
    queue = [node]
    while queue:
        for base in queue.pop().bases:
            if isinstance(base, ast.Name) and (local := classes.get(base.id)) not in (None, node, *found):
                found.append(local)
                queue.append(local)
    return found
