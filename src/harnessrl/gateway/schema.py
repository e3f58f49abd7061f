"""The OpenAI chat-completions request schema the gateway accepts, validated once at the edge.

Unknown fields are rejected with their name (as OpenAI does), so a typo never silently changes a
run. Fields OpenAI defines that cannot change what the tiny engine does are accepted and ignored;
those that would change sampling are accepted only at their neutral value.

Before any field is validated, every request body is walked once (`check_json`): text must be valid
Unicode (a lone surrogate such as "\\ud800" cannot be tokenised or stored), numbers finite, and no
value nested deeper than MAX_DEPTH. What passes can be tokenised, rendered and stored as a JSON line,
so an accepted episode can always be read back. A failure raises `InputError` naming the path.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from harnessrl.types import Outcome, Task

MAX_DEPTH = 48  # levels of nesting in a request body (the deepest legitimate one, a JSON Schema, is far below)
SEED_RANGE = (-(2**63), 2**63 - 1)  # int64, as OpenAI; seed + i for choice i still fits torch's 64-bit seeds

MAX_STOP_CHARS = 256  # the engine decodes the last tokens of every completion against each stop at each step


class InputError(Exception):
    """A request value that can be parsed but not accepted; `param` is its path (`messages.0.content`).

    Not a ValueError on purpose: pydantic lets it through untouched, so the gateway answers 400 naming
    the exact path instead of a validation error about the whole body."""

    def __init__(self, path: tuple, message: str):
        self.path, self.message = path, message
        # a key can be the bad text itself: the gateway's error response escapes what it cannot send
        self.param = ".".join(map(str, path[:12])) + (".…" if len(path) > 12 else "") or None
        super().__init__(f"{self.param or 'body'}: {message}")

    def under(self, *prefix) -> InputError:
        """The same error in a body that nests this one's under `prefix` (pydantic does not add the path)."""
        return InputError((*prefix, *self.path), self.message)


def check_json(value: Any, path: tuple = ()) -> None:
    """Every string (keys too) encodable as UTF-8, every float finite, nothing deeper than MAX_DEPTH."""
    stack = [(value, path)]
    while stack:  # iterative: a hostile body must not exhaust Python's recursion
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise InputError(path, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, str):
            _encodable(value, path)
        elif isinstance(value, float) and not math.isfinite(value):
            raise InputError(path, f"{value} is not a JSON number")
        elif isinstance(value, dict):
            for key, item in value.items():
                _encodable(str(key), (*path, key))
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))


def _encodable(text: str, path: tuple) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(path, f"not valid Unicode text: a lone surrogate at character {exc.start}") from None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Body(_Strict):
    """A whole request body: checked by `check_json` before its fields are validated."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        check_json(data)
        return data


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    arguments: str = Field(description="JSON-encoded object, as OpenAI sends it")


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> Message:
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError("only assistant messages carry tool_calls")
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The plain dict a Hugging Face chat template renders."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    def identity(self) -> tuple:
        """What makes two messages the same turn: role, text and tool calls (ids aside)."""
        calls = tuple((c.function.name, _canonical_json(c.function.arguments)) for c in self.tool_calls or ())
        role = "system" if self.role == "developer" else self.role
        return (role, self.text(), calls, self.tool_call_id if self.role == "tool" else None)


class FunctionSpec(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict, description="a JSON Schema (checked before any template)")
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _json_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        if problem := _schema_problem(json.dumps(v, sort_keys=True)):  # an agent sends the same tools every turn
            raise ValueError(problem)
        return v


@functools.lru_cache(maxsize=1024)
def _schema_problem(schema: str) -> str | None:
    """Why a JSON text is not a JSON Schema (2020-12 metaschema), or None; ~1.4 ms a check, so cached."""
    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(schema))
    except jsonschema.SchemaError as exc:
        return f"not a JSON Schema at {'.'.join(map(str, exc.path)) or 'the schema'}: {exc.message}"
    return None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: dict[Literal["name"], str]


class ResponseFormat(_Strict):
    type: Literal["text"]


class ChatRequest(_Body):
    messages: list[Message] = Field(min_length=1)
    model: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # strict, as OpenAI's API: `true` is no temperature and "3" no max_tokens (pydantic would coerce both)
    temperature: float = Field(default=1.0, ge=0, le=2, strict=True)
    top_p: float = Field(default=1.0, gt=0, le=1, strict=True)
    max_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1, strict=True)
    n: int = Field(default=1, ge=1, le=16, strict=True)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1], strict=True)
    logprobs: bool = Field(default=False, strict=True)
    top_logprobs: Literal[0] | None = None
    ignore_eos: bool = Field(default=False, strict=True, description="extension (as vLLM): sample until max_tokens")
    metadata: dict[str, str] | None = Field(
        default=None, max_length=16, description="`agent` names the caller; `trainable`: 'false' freezes it"
    )
    # only False: true is a 400 that says streaming is unsupported (`_no_streaming`)
    stream: bool = Field(default=False, strict=True)
    frequency_penalty: Literal[0] | None = None
    presence_penalty: Literal[0] | None = None
    logit_bias: dict[str, float] | None = Field(default=None, max_length=0)
    response_format: ResponseFormat | None = None
    # accepted and ignored: they do not change what is sampled
    user: str | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    service_tier: str | None = None
    stream_options: dict[str, Any] | None = None  # refused unless null or {}, as vLLM does without stream true
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @field_validator("temperature", "top_p", "n", "logprobs", "ignore_eos", "stream", mode="before")
    @classmethod
    def _null_is_default(cls, v: Any, info: ValidationInfo) -> Any:
        # null is "not given" in OpenAI's API and vLLM's: an agent's `create(temperature=None)` sends it
        return cls.model_fields[info.field_name].default if v is None else v

    @field_validator("metadata")
    @classmethod
    def _metadata_sizes(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for key, value in (v or {}).items():  # OpenAI's limits
            if len(key) > 64 or len(value) > 512:
                raise ValueError(f"metadata {key[:64]!r}: keys up to 64 characters, values up to 512")
        return v

    @field_validator("stream")
    @classmethod
    def _no_streaming(cls, v: bool) -> bool:
        if v:  # an InputError, not pydantic's "Input should be False", so the agent's author learns why
            raise InputError(("stream",), "streaming is not supported: send stream false (or leave it out)")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > 4 or any(not s or len(s) > MAX_STOP_CHARS for s in stops):  # each is checked every step
            raise ValueError(f"stop takes at most 4 non-empty strings of up to {MAX_STOP_CHARS} characters")
        return v

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> ChatRequest:
        if self.stream_options:  # stream is false here: `_no_streaming` refused true
            raise InputError(("stream_options",), "only allowed with stream true, and streaming is not supported: "
                             "leave stream_options out (or null)")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _tool_choice_needs_tools(self) -> ChatRequest:
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or ()}
            if self.tool_choice.function.get("name") not in names:
                raise InputError(("tool_choice", "function", "name"), "names a function that is not in tools")
        elif self.tool_choice == "required" and not self.tools:
            raise InputError(("tool_choice",), "'required' needs tools")
        return self

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def tool_specs(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


class Demonstration(_Body):
    """A scripted expert's turn: the conversation so far and the assistant message it chose."""

    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    reply: Message

    @model_validator(mode="after")
    def _reply_is_assistant(self) -> Demonstration:
        if self.reply.role != "assistant":
            raise InputError(("reply", "role"), "the reply must be an assistant message")
        return self


class EpisodeCreate(_Body):
    task: Task = Field(default_factory=Task)
    agent: str = Field(default="main", description="agent name recorded on calls that do not name one")
    trainable: bool = Field(default=True, description="default for calls of this episode")


class EpisodeFinish(_Body):
    outcome: Outcome = Field(default_factory=Outcome)
    status: Literal["finished", "failed"] = "finished"
    failure_reason: str | None = None


class FeedbackBody(_Body):
    """A user's response to a call: accepted, rejected, edited, a dissatisfied follow-up, or a scalar."""

    call: int | str | None = Field(
        default=None, description="the call: its index, the chat completion id the client got, or None for the last"
    )
    signal: Literal["accepted", "rejected", "edited", "dissatisfied", "scalar"]
    value: float | None = Field(default=None, ge=-1.0, le=1.0, description="the score of a `scalar` signal, -1..1")

    @model_validator(mode="after")
    def _value_for_scalar(self) -> FeedbackBody:
        if (self.signal == "scalar") != (self.value is not None):
            raise InputError(("value",), "given with signal 'scalar' and only with it")
        if isinstance(self.call, int) and self.call < 0:
            raise InputError(("call",), "an index is 0 or more")
        return self


def _canonical_json(text: str) -> str:
    """The arguments in one canonical form; text that does not parse (or is hostile: 5,000-digit numbers,
    nesting that exhausts the recursion limit) compares as itself."""
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError, as is int's digit limit
        return text
