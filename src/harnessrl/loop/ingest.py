"""`harnessrl ingest traces.jsonl`: production conversations in OpenAI chat format, as tasks or SFT data.

One conversation per line:

    {"id": "optional", "messages": [...], "tools": [...], "outcome": {...}, "feedback": {"signal": "accepted"}}

Every line is validated with the gateway's own request models (the messages a chat call would
accept), needs a user message, and an optional outcome / feedback as the gateway records them. A bad
line goes to the quarantine file (rewritten each run) with its line number and reason; nothing is
dropped: imported + quarantined = lines, always. A trace's id is the sha256 of its canonical JSON, so
importing the same file again adds nothing (`duplicates` counts lines already in the store or earlier
in the file). Outputs: the store's `traces` table, and optionally Task JSONL (replay: the conversation
up to its last assistant turn, that turn and the outcome in `task.data`) and demonstration JSONL (SFT:
`POST /v1/demonstrations` bodies, for conversations that end with an assistant turn).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harnessrl.gateway.schema import FeedbackBody, InputError, Message, Tool, check_json
from harnessrl.loop.store import Store
from harnessrl.types import Outcome, Task, first_error


class Trace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(default=None, description="the producer's own id, kept in task.data")
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    outcome: Outcome | None = None
    feedback: FeedbackBody | None = None

    @field_validator("feedback", mode="before")
    @classmethod
    def _feedback(cls, value: Any) -> Any:
        try:  # its checks name `value` and `call`: here they are feedback's
            return value if value is None or isinstance(value, FeedbackBody) else FeedbackBody.model_validate(value)
        except InputError as exc:
            raise exc.under("feedback") from None


def ingest(
    path: Path, store: Store, quarantine: Path, tasks_out: Path | None = None, sft_out: Path | None = None
) -> dict[str, int]:
    counts = {"lines": 0, "imported": 0, "quarantined": 0, "duplicates": 0}
    rows, bad, seen, tasks, demos = [], [], set(), [], []
    with open(path, "rb") as f:
        raw_lines = f.read().split(b"\n")
    if raw_lines and raw_lines[-1] == b"":  # the file's final newline ends the last line; it is not a line
        raw_lines.pop()
    for number, raw in enumerate(raw_lines, start=1):
        counts["lines"] += 1
        trace, reason = _parse(raw)
        if trace is None:
            bad.append({"line": number, "reason": reason, "text": raw.decode("utf-8", "backslashreplace")[:2000]})
            continue
        canonical = trace.model_dump_json(exclude_none=True)
        trace_id = hashlib.sha256(canonical.encode()).hexdigest()[:32]
        counts["imported"] += 1
        if trace_id in seen:
            counts["duplicates"] += 1
            continue
        seen.add(trace_id)
        rows.append((trace_id, number, canonical))
        tasks.append(_task(trace_id, trace))
        if trace.messages[-1].role == "assistant":
            demos.append(_demonstration(trace))
    new = store.add_traces(str(path), rows)
    counts["duplicates"] += len(rows) - new
    counts["quarantined"] = len(bad)
    _write_jsonl(quarantine, bad)
    if tasks_out is not None:
        _write_jsonl(tasks_out, [t.model_dump(mode="json") for t in tasks])
    if sft_out is not None:
        _write_jsonl(sft_out, demos)
    return counts


def _parse(raw: bytes) -> tuple[Trace | None, str]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8: {exc}"
    if not text.strip():
        return None, "empty line"
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        return None, f"not JSON (truncated?): {exc}"
    if not isinstance(data, dict):
        return None, f"not a JSON object but {type(data).__name__}"
    try:  # valid JSON can still hold what no store keeps: a lone surrogate, NaN (stored as null), deep nesting
        check_json(data)
        trace = Trace.model_validate(data)
    except ValidationError as exc:
        return None, first_error(exc, "line")
    except InputError as exc:
        return None, str(exc)
    if not any(m.role == "user" for m in trace.messages):
        return None, "messages: no user message"
    return trace, ""


def _task(trace_id: str, trace: Trace) -> Task:
    messages = trace.messages  # the conversation up to its last assistant turn, and that turn (a user's "thanks" after)
    asked = next(i for i, m in enumerate(messages) if m.role == "user")  # a greeting before it answers nothing
    last_reply = next((i for i in range(len(messages) - 1, asked, -1) if messages[i].role == "assistant"), None)
    context = messages[:last_reply] if last_reply is not None else messages
    first_user = next(m for m in messages if m.role == "user")
    return Task(
        id=trace_id,
        prompt=first_user.content if isinstance(first_user.content, str) else None,
        data={
            "trace_id": trace.id,
            "messages": [m.model_dump(mode="json", exclude_none=True) for m in context],
            "reply": messages[last_reply].model_dump(mode="json", exclude_none=True)
            if last_reply is not None
            else None,
            "tools": [t.model_dump(mode="json", exclude_none=True) for t in trace.tools] if trace.tools else None,
            "outcome": trace.outcome.model_dump(mode="json") if trace.outcome else None,
            "feedback": trace.feedback.model_dump(mode="json") if trace.feedback else None,
        },
    )


def _demonstration(trace: Trace) -> dict:
    body = {
        "messages": [m.model_dump(mode="json", exclude_none=True) for m in trace.messages[:-1]],
        "reply": trace.messages[-1].model_dump(mode="json", exclude_none=True),
    }
    if trace.tools:
        body["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in trace.tools]
    return body


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
