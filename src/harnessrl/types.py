"""The shared vocabulary: Task, Call, Episode, Outcome, RewardBreakdown.

Every part of harnessrl passes these typed objects, never bare dicts. An Episode is saved as one
JSON line (`episode.to_json()`) and loaded back exactly (`Episode.from_json(line)`): that line is
the unit the trace store, replay buffer, SFT data and reports share. This module knows nothing
about models, HTTP or training.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Hashable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class _Model(BaseModel):
    # unknown keys are errors, so a typo in a trace line names its field instead of vanishing; NaN and infinities
    # are written as the strings "NaN" / "Infinity" (JSON has no such numbers, pydantic's default wrote null, and a
    # line holding a NaN metric or a -inf logprob was refused when read back)
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class Task(_Model):
    """One thing to do. `data` holds whatever the environment needs (question, gold answer, ...)."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12], description="stable task id; groups share it")
    prompt: str | None = Field(default=None, description="the instruction shown to the agent, if any")
    data: dict[str, Any] = Field(default_factory=dict, description="environment-specific fields")
    split: Literal["train", "test"] | None = Field(default=None, description="which split it belongs to")


class Call(_Model):
    """One sampled completion, token-exact: what the policy saw and what it sampled.

    `sampled_logprobs[i]` is the log-probability of `completion_ids[i]` under the distribution it was
    actually drawn from: softmax(logits / temperature) cut to its top-p nucleus and renormalised, with
    the `temperature` and `top_p` recorded here, so the trainer can score the same distribution. A
    greedy call (temperature 0) records 0.0 and a demonstration (an expert's reply) 0.0: neither is a
    sample, and the trainer never takes an importance ratio against them (`sampled` is False).
    `extends_call` is the index of an earlier call of the episode whose prompt + completion this
    call's prompt begins with (the gateway reused its ids); None starts a new sequence.

    The call tree (`harnessrl.calltree`): `lineage` names one conversation of one agent (a sub-agent
    assigned two tasks has two lineages), `parent_call` the earlier call whose tool call spawned that
    conversation. A frozen model's call has `trainable` False, its `model` name and a version that
    never changes.
    """

    agent: str = Field(default="main", description="which agent of the harness made the call")
    model: str | None = Field(default=None, description="the model that served the call (None: the trainable policy)")
    lineage: str | None = Field(default=None, description="the conversation the call belongs to; None: its agent's")
    parent_call: int | None = Field(default=None, ge=0, description="index of the call that spawned this lineage")
    prompt_ids: list[int]
    completion_ids: list[int]
    sampled_logprobs: list[float]
    policy_version: int = Field(description="weights version that sampled the first completion token")
    trainable: bool = Field(default=True, description="False for frozen sub-agents: recorded, never trained on")
    temperature: float = Field(default=1.0, ge=0, description="the sampling temperature; 0 = greedy")
    top_p: float = Field(default=1.0, gt=0, le=1, description="the nucleus it was sampled from")
    demonstration: bool = Field(default=False, description="an expert's reply recorded as a call, not sampled")
    finish_reason: Literal["stop", "length", "tool_calls"] = "stop"
    extends_call: int | None = Field(default=None, ge=0)
    tool_call_error: str | None = Field(default=None, description="why emitted tool calls were returned as text")
    started_at: float = Field(default_factory=time.time, description="unix seconds when the request arrived")
    ended_at: float = Field(default_factory=time.time, description="unix seconds when the completion was ready")

    @property
    def sampled(self) -> bool:
        """Drawn at random by the policy, so its logprobs are behaviour logprobs an importance ratio may use."""
        return self.temperature > 0 and not self.demonstration

    @model_validator(mode="after")
    def _aligned(self) -> Call:
        if len(self.sampled_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"sampled_logprobs has {len(self.sampled_logprobs)} entries "
                f"but completion_ids has {len(self.completion_ids)}"
            )
        return self


class Outcome(_Model):
    """What a harness reports when an episode ends."""

    answer: str | None = Field(default=None, description="the agent's final answer, if it gave one")
    success: bool | None = Field(default=None, description="the harness's own verdict, if it has one")
    info: dict[str, Any] = Field(default_factory=dict, description="anything else rewards may read")


class RewardBreakdown(_Model):
    """A score that explains itself: the total, every named term (weighted) and its weight at that step.

    `flags` names the reward-hacking detectors that fired; `failure` says why the score could not be
    computed (a judge that timed out or answered nonsense): such an episode's group is left out of
    the advantage instead of being scored 0.
    """

    total: float
    terms: dict[str, float] = Field(default_factory=dict)
    weights: dict[str, float] = Field(default_factory=dict, description="each term's weight at scoring time")
    values: dict[str, float] = Field(
        default_factory=dict, description="each term before weighting: a term at weight 0 is watched, not paid"
    )
    flags: list[str] = Field(default_factory=list, description="hacking detectors that fired")
    failure: str | None = Field(default=None, description="why the reward could not be computed")


class Episode(_Model):
    """One run of a harness on a task: its calls, outcome, reward and how it ended."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    task: Task = Field(default_factory=Task)
    calls: list[Call] = Field(default_factory=list)
    outcome: Outcome | None = None
    reward: RewardBreakdown | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    status: Literal["running", "finished", "failed"] = "running"
    failure_reason: str | None = None

    @model_validator(mode="after")
    def _links(self) -> Episode:
        """Each call's `extends_call` and `parent_call` name an earlier call, and an extended call's prompt +
        completion begin this call's prompt (what the gateway records; `harnessrl inspect` and `eval` rely on it)."""
        for index, call in enumerate(self.calls):
            for key in ("parent_call", "extends_call"):
                if (earlier := getattr(call, key)) is not None and earlier >= index:
                    raise ValueError(f"calls.{index}.{key}: {earlier} is not an earlier call")
            if call.extends_call is not None:
                extended = self.calls[call.extends_call]
                head = extended.prompt_ids + extended.completion_ids
                if call.prompt_ids[: len(head)] != head:
                    raise ValueError(
                        f"calls.{index}.extends_call: its prompt_ids do not begin with call {call.extends_call}'s"
                        " prompt_ids + completion_ids"
                    )
        return self

    @property
    def demonstrated(self) -> bool:
        """Every call an expert's reply (`Call.demonstration`): nothing in it was sampled."""
        return bool(self.calls) and all(c.demonstration for c in self.calls)

    @property
    def succeeded(self) -> bool:
        """The harness's own verdict (`Outcome.success`); False without an outcome."""
        return bool(self.outcome and self.outcome.success)

    def to_json(self) -> str:
        """One JSON line (no newline inside)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, line: str) -> Episode:
        return cls.model_validate_json(line)


class TraceLineError(ValueError):
    """A JSONL line that does not validate: the message names the file, the line and the field."""


M = TypeVar("M", bound=BaseModel)


def read_jsonl(path: Path, model: type[M]) -> list[M]:
    """Every non-blank line of a JSONL file as `model`, or TraceLineError at the first bad line."""
    return [row for _, row in read_jsonl_numbered(path, model)]


def read_jsonl_numbered(path: Path, model: type[M]) -> list[tuple[int, M]]:
    """`read_jsonl` with each row's line number (blank lines are skipped, so rows and lines differ)."""
    rows = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a BOM some editors write first
            except UnicodeDecodeError as exc:
                raise TraceLineError(f"{path}: line {number}: not UTF-8 (byte {exc.start} of the line)") from None
            if not line.strip():
                continue
            try:
                rows.append((number, model.model_validate_json(line)))
            except ValidationError as exc:
                raise line_error(path, number, exc) from None
    if not rows:
        raise TraceLineError(f"{path}: no lines")
    return rows


def line_error(path: Path, number: int, exc: ValidationError) -> TraceLineError:
    """The error of a JSONL line that did not validate: file, line, the first field at fault, its message."""
    return TraceLineError(f"{path}: line {number}: {first_error(exc, 'line')}")


def first_error(exc: ValidationError, whole: str, data: Any = None) -> str:
    """`field.path: message` of the first error pydantic found; `whole` names the thing when no field is at fault.
    Given the `data` validated, a union's member names in the path (`budget_seconds.constrained-float`) are found as
    names `data` does not hold: the field is named once, with what each member wanted."""
    errors = exc.errors()
    first = errors[0]
    if not first["loc"] and first["type"] == "value_error":  # a model validator's message names its own fields
        return first["msg"].removeprefix("Value error, ")
    if data is not None:
        path, at = input_path(first["loc"], data, first["type"] == "missing")
        if at is not None:
            wanted = dict.fromkeys(e["msg"] for e in errors if e["loc"][:at] == first["loc"][:at])
            return f"{'.'.join(map(str, path)) or whole}: {'; or '.join(wanted)}"
    return f"{'.'.join(map(str, first['loc'])) or whole}: {first['msg']}"


def input_path(loc: tuple, data: Any, missing: bool = False) -> tuple[list, int | None]:
    """The parts of an error's `loc` that are positions in `data` (and the field a `missing` error names, last), and
    the index of the first part that is none (pydantic's name of a union's member: `str`, `list[str]`), or None."""
    path, value, member = [], data, None
    for i, part in enumerate(loc):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and type(part) is int and 0 <= part < len(value):
            value = value[part]
        elif not (missing and i == len(loc) - 1):
            member = i if member is None else member
            continue
        path.append(part)
    return path, member


def read_yaml(path: Path) -> Any:
    """The YAML document in a file, or ValueError naming the file (and the line where it stops parsing)."""
    import yaml

    try:
        return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_unique_keys_loader())
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 (byte {exc.start})") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = ": ".join(part for part in (exc.context, exc.problem) if part)
        raise ValueError(f"{path}: {where}not YAML: {reason}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML: {exc}") from None


@functools.cache
def _unique_keys_loader() -> type:
    """PyYAML's safe loader, refusing a key given twice in one mapping (two `rl:` blocks: the last won, silently)."""
    import yaml

    def mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            # `<<: *base` (its keys may be overridden here) and `=` (a value key): what safe_load makes of them
            if key_node.tag in ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"):
                continue
            key = loader.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            if isinstance(key, Hashable):
                seen.add(key)
        return loader.construct_mapping(node, deep)

    loader = type("UniqueKeysLoader", (yaml.SafeLoader,), {})
    loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return loader


def validated(model: type[M], data: Any, path: Path) -> M:
    """`model` from what a file held, or ValueError naming the file, then the first field at fault and its message."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{path}: {first_error(exc, 'config', data)}") from None
