"""A scripted expert for SFT demonstrations: it knows the fix (the task's reference/) and acts it out.

list_files -> for each changed block: read_file (the lines around it) -> edit_file (the block) ->
run_tests -> submit. Each turn is recorded through the gateway's `POST /v1/demonstrations`, so the
demonstrations carry exactly the prompts and template of real rollouts. With probability
`p_explore` it first searches for the function by name, so the model also sees search_code used.
"""

from __future__ import annotations

import difflib
import json
import random
import tempfile
from pathlib import Path

import openai

from harnessrl.envs.code.harness import CodingAgent, _Run, occurrences
from harnessrl.types import Outcome, Task


def fix_edits(broken: str, fixed: str) -> list[tuple[int, str, str]]:
    """(first line, search, replace) for each changed block of whole lines that turns `broken` into `fixed`, in
    order: each is read off the text as the edits before it left it, widened by a line each side until its search
    text occurs once there (overlapping occurrences counted, as edit_file counts them)."""
    old, new = broken.splitlines(keepends=True), fixed.splitlines(keepends=True)
    text, shift, edits = list(old), 0, []  # text: the file after the edits so far; shift: its lines moved since
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        start, end = a, b = i1 + shift, i2 + shift  # the block in `text`; a..b widens around it
        while occurrences("".join(text), "".join(text[a:b])) != 1 and (a > 0 or b < len(text)):
            a, b = a - (a > 0), b + (b < len(text))
        replace = [*text[a:start], *new[j1:j2], *text[end:b]]
        edits.append((a + 1, "".join(text[a:b]), "".join(replace)))
        text[a:b] = replace
        shift += (j2 - j1) - (i2 - i1)
    return edits


class CodeExpert:
    def __init__(self, agent: CodingAgent, seed: int = 0, p_explore: float = 0.3):
        self.agent, self.seed, self.p_explore = agent, seed, p_explore

    async def __call__(self, task: Task, llm: openai.AsyncOpenAI) -> Outcome:
        rng = random.Random(f"{self.seed}:{task.id}")
        with tempfile.TemporaryDirectory(prefix="harnessrl-code-") as tmp:
            workspace = Path(tmp) / "workspace"
            run = _Run(self.agent, task, workspace)

            async def do(name: str, **arguments) -> None:
                call = {"id": f"call_{run.turns}", "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
                reply = {"role": "assistant", "content": None, "tool_calls": [call]}
                await llm.post("/demonstrations", cast_to=object,
                               body={"messages": run.messages, "tools": run.tools.schemas, "reply": reply})  # fmt: skip
                run.turns += 1
                run.messages.append(reply)
                result, _ = await run.tools.call(name, arguments)
                run.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})

            reference = run.folder / "reference"
            files = sorted(str(p.relative_to(reference)) for p in reference.rglob("*") if p.is_file())
            await do("list_files")
            function = run.spec.source.get("function")
            if function and rng.random() < self.p_explore:
                await do("search_code", pattern=rf"def {function}\b")
            for path in files:
                for line, search, replace in fix_edits((workspace / path).read_text(), (reference / path).read_text()):
                    await do("read_file", path=path, start=max(1, line - 12), end=line + 6)
                    await do("edit_file", path=path, search=search, replace=replace)
            await do("run_tests")
            await do("submit")
            return run.outcome()
