"""The coding agent (Cursor Composer pattern, small): read, search, edit, run the visible tests, submit.

An ordinary openai-client loop over six tools on a fresh copy of the task's repo/. At submit (or
when turns run out) the workspace is scored against the hidden tests (envs/code/score.py): the
agent never sees them, and what it did to test files is dropped and reported.

Self-summarisation: when a turn's context passes `summarise_at` tokens, the harness asks the model,
through the same client (so the gateway records it token-exactly as one more call of the main
conversation, agent "summariser"), to summarise its progress in at most `summary_tokens`; the
conversation then restarts from the issue and that summary. The edited history starts a new
training sequence; with `TrainConfig.segments: share` the chain's segments share the episode's
advantage with weights summing to 1, and `mask_agents: [summariser]` takes the summary tokens out
of the loss (the ablation).
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from pathlib import Path

import openai
import regex

from harnessrl.envs.code import sandbox
from harnessrl.envs.code.score import python_argv, regular_files, score, too_big
from harnessrl.envs.code.tasks import load_task
from harnessrl.harness import Toolbox
from harnessrl.harness.tools import matching
from harnessrl.types import Outcome, Task

SYSTEM = "You fix bugs in a small Python project. Read the code, edit it, run the tests, then submit."
SUMMARISE = (
    "Your context is full. Summarise your progress for yourself: the bug, the file and function, what you "
    "changed and what remains. Plain text, no tool calls."
)
_MAX_LINES = 60
_MAX_OUTPUT = 1500
_MAX_LINE = 200  # characters of one search_code hit or read_file line
_MAX_FILES = 200  # paths list_files shows
_MAX_HITS = 20
_SEARCH_LINE = 2000  # characters of a line search_code matches against
_SEARCH_SECONDS = 2.0  # one search_code call's regex time: `(a+)+b` on a long line would run for hours


class CodingAgent:
    def __init__(
        self,
        max_turns: int = 10,
        max_tokens: int = 192,
        temperature: float = 1.0,
        summarise_at: int | None = None,
        summary_tokens: int = 96,
        limits: sandbox.Limits = sandbox.Limits(
            wall_seconds=30, cpu_seconds=30, memory_mb=1024, processes=32, workspace_mb=sandbox.WORKSPACE_MB
        ),
    ):
        self.max_turns, self.max_tokens, self.temperature = max_turns, max_tokens, temperature
        self.summarise_at, self.summary_tokens, self.limits = summarise_at, summary_tokens, limits

    async def __call__(self, task: Task, llm: openai.AsyncOpenAI) -> Outcome:
        with tempfile.TemporaryDirectory(prefix="harnessrl-code-") as tmp:
            run = _Run(self, task, Path(tmp) / "workspace")
            return await run.loop(llm)


class _Run:
    """One episode: its workspace, messages and what the agent did."""

    def __init__(self, agent: CodingAgent, task: Task, workspace: Path):
        # resolved: the tools compare resolved targets with it (TMPDIR behind a symlink would put every path outside)
        self.agent, self.task, self.workspace = agent, task, workspace.resolve()
        self.folder = Path(task.data["task_dir"])
        self.spec = load_task(self.folder)
        shutil.copytree(self.folder / "repo", self.workspace, symlinks=True)
        self.edited: list[str] = []
        self.commands: list[str] = []
        self.submitted = False
        self.turns = self.summaries = 0
        self.start = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.prompt}]
        self.messages = list(self.start)
        self.tools = Toolbox(
            [self.list_files, self.read_file, self.search_code, self.edit_file, self.run_tests, self.submit],
            timeout=agent.limits.wall_seconds + 10,
        )

    # ---- tools (their docstrings are what the model sees) ---------------------------------------

    def list_files(self) -> str:
        """List the project's files."""
        paths = [str(p.relative_to(self.workspace)) for p in regular_files(self.workspace)]
        more = len(paths) - _MAX_FILES
        return "\n".join(
            paths[:_MAX_FILES] + [f"... and {more} more files (the first {_MAX_FILES} are listed)"] * (more > 0)
        )

    def read_file(self, path: str, start: int = 1, end: int | None = None) -> str:
        """Read lines start..end of a file (numbered)."""
        lines = _read_text(self._path(path), path).splitlines()
        end = min(end or len(lines), len(lines), start + _MAX_LINES - 1)
        return "\n".join(f"{n}: {_cut(lines[n - 1])}" for n in range(max(start, 1), end + 1)) or "(no lines)"

    def search_code(self, pattern: str) -> str:
        """Lines matching a regex, as path:line: text."""
        files = (p for p in regular_files(self.workspace) if p.suffix == ".py" and not too_big(p))
        lines = (((p, n, line), line[:_SEARCH_LINE]) for p in files
                 for n, line in enumerate(p.read_text(errors="replace").splitlines(), start=1))  # fmt: skip
        try:
            found = list(itertools.islice(matching(pattern, lines, _SEARCH_SECONDS), _MAX_HITS))
        except regex.error as exc:
            return f"error: bad pattern: {exc}"
        except ValueError as exc:  # past _SEARCH_SECONDS
            return f"error: {exc}"
        hits = [f"{p.relative_to(self.workspace)}:{n}: {line.strip()[:_MAX_LINE]}" for p, n, line in found]
        return "\n".join(hits) or "no matches"

    def edit_file(self, path: str, search: str, replace: str) -> str:
        """Replace the exact text `search` (it must occur once) with `replace` in a file."""
        target = self._path(path, must_exist=False)
        if not target.exists():
            if search:
                return f"error: {path} does not exist (to create it, pass an empty search)"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(replace.encode())
        else:
            text = _read_text(target, path)
            crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")  # edited as \n, written back as \r\n
            if crlf:
                text, search, replace = (t.replace("\r\n", "\n") for t in (text, search, replace))
            found = occurrences(text, search) if search else 0
            if found != 1:
                why = "is empty" if not search else "was not found" if not found else f"occurs {found} times"
                return f"error: the search text {why} in {path}; copy it exactly from read_file, with enough lines to be unique"
            if replace == search:
                return f"error: replace is the same as search, so {path} is unchanged; replace holds the corrected text"
            text = text.replace(search, replace, 1)
            target.write_bytes((text.replace("\n", "\r\n") if crlf else text).encode())
        self.edited.append(str(target.relative_to(self.workspace)))
        return f"edited {path}"

    def run_tests(self) -> str:
        """Run the project's visible tests."""
        command = [
            *python_argv(self.spec.test_command),
            "-q",
            "-p",
            "no:cacheprovider",
            "--tb=short",
            *self.spec.visible_tests,
        ]
        self.commands.append(" ".join(command))
        result = sandbox.run(command, self.workspace, self.agent.limits)
        status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        status += " (the workspace passed its disk cap: files the tests wrote were removed)" * result.disk_full
        return f"{status}\n{(result.stdout + result.stderr)[-_MAX_OUTPUT:]}"

    def submit(self) -> str:
        """Submit your fix (ends the task)."""
        self.submitted = True
        return "submitted"

    # ---- the loop -----------------------------------------------------------------------------

    async def loop(self, llm: openai.AsyncOpenAI) -> Outcome:
        while not self.submitted and self.turns < self.agent.max_turns:
            response = await llm.chat.completions.create(
                model="policy", messages=self.messages, tools=self.tools.schemas,
                max_tokens=self.agent.max_tokens, temperature=self.agent.temperature,
            )  # fmt: skip
            self.turns += 1
            message = response.choices[0].message.model_dump(exclude_none=True)
            self.messages.append(message)
            calls = message.get("tool_calls") or []
            for call in calls:
                result, _ = await self.tools.call(call["function"]["name"], call["function"]["arguments"])
                self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            if not calls:
                self.messages.append({"role": "user", "content": "Use a tool; call submit when the fix is done."})
            if self.agent.summarise_at and response.usage.total_tokens >= self.agent.summarise_at:
                await self.summarise(llm)
        return await asyncio.to_thread(self.outcome)

    async def summarise(self, llm: openai.AsyncOpenAI) -> None:
        """Ask for a summary of the work so far, then go on from the issue and that summary alone."""
        response = await llm.chat.completions.create(
            model="policy", messages=[*self.messages, {"role": "user", "content": SUMMARISE}],
            max_tokens=self.agent.summary_tokens, temperature=self.agent.temperature,
            metadata={"agent": "summariser", "lineage": "main"},
        )  # fmt: skip
        summary = response.choices[0].message.content or ""
        self.summaries += 1
        self.messages = [*self.start, {"role": "user", "content": f"Your summary of the work so far:\n{summary}"}]

    def outcome(self) -> Outcome:
        hidden = score(self.spec, self.folder, self.workspace, self.agent.limits)
        found = hidden.changes
        solved = hidden.failure is None and hidden.passed == hidden.total and not hidden.regressions
        return Outcome(
            answer=found.diff,
            success=solved,
            info={"submitted": self.submitted, "turns": self.turns, "summaries": self.summaries,
                  "edited_files": sorted(set(self.edited)), "commands": self.commands, "diff": found.diff,
                  "dropped": found.dropped, "lines_changed": found.lines_changed,
                  "hidden": {"passed": hidden.passed, "total": hidden.total, "regressions": hidden.regressions,
                             "others": hidden.others, "failure": hidden.failure, "invalid": hidden.invalid},
                  "impossible": self.spec.impossible, "guards": hidden.guards},
        )  # fmt: skip

    def _path(self, path: str, must_exist: bool = True) -> Path:
        if path.encode(errors="replace").decode() != path:  # JSON's "\udcff": a name no outcome (JSON) could hold
            raise ValueError(f"{path!r} is not UTF-8 text")
        target = (self.workspace / path).resolve()
        if not target.is_relative_to(self.workspace):
            raise ValueError(f"{path} is outside the project")
        if must_exist and not target.is_file():
            raise FileNotFoundError(f"{path}: no such file (list_files shows them)")
        if target.is_file() and (why := too_big(target)):
            raise ValueError(f"{path}: {why}")
        if target.exists() and not target.is_file():  # a folder, or a FIFO the agent's code made: never opened
            raise ValueError(f"{path} is not a regular file")
        return target


def occurrences(text: str, search: str) -> int:
    r"""How often `search` occurs in `text`, overlapping occurrences too (`str.count` sees one "x\nx\n" in
    "x\nx\nx\n")."""
    found, at = 0, text.find(search)
    while at != -1:
        found, at = found + 1, text.find(search, at + 1)
    return found


def _read_text(target: Path, path: str) -> str:
    r"""A file's text as it is on disk: UTF-8, its line endings untouched (read_text would turn \r\n into \n)."""
    try:
        return target.read_bytes().decode()
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}): read_file and "
            "edit_file open UTF-8 files only"
        ) from None


def _cut(line: str) -> str:
    """A line shortened to _MAX_LINE characters, saying so."""
    return line if len(line) <= _MAX_LINE else f"{line[:_MAX_LINE]} [... {len(line) - _MAX_LINE} more characters]"
