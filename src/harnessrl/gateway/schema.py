"""The OpenAI chat-completions request schema the gateway accepts, validated once at the edge.

Unknown fields are rejected with their name (as OpenAI does), so a typo never silently changes a
run. Fields OpenAI defines that cannot change what the tiny engine does are accepted and ignored;
those that would change sampling are accepted only at their neutral value.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harnessrl.types import Outcome, Task


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: dict[Literal["name"], str]


class ResponseFormat(_Strict):
    type: Literal["text"]


class ChatRequest(_Strict):
    messages: list[Message] = Field(min_length=1)
    model: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: Literal[0] | None = None
    ignore_eos: bool = Field(default=False, description="extension (as vLLM): sample until max_tokens")
    metadata: dict[str, str] | None = Field(
        default=None, description="`agent` names the caller; `trainable`: 'false' freezes it"
    )
    stream: Literal[False] = False
    frequency_penalty: Literal[0] | None = None
    presence_penalty: Literal[0] | None = None
    logit_bias: dict[str, float] | None = Field(default=None, max_length=0)
    response_format: ResponseFormat | None = None
    # accepted and ignored: they do not change what is sampled
    user: str | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    service_tier: str | None = None
    stream_options: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return v

    @model_validator(mode="after")
    def _tool_choice_needs_tools(self) -> ChatRequest:
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or ()}
            if self.tool_choice.function.get("name") not in names:
                raise ValueError("tool_choice names a function that is not in tools")
        elif self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        return self

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def tool_specs(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


class Demonstration(_Strict):
    """A scripted expert's turn: the conversation so far and the assistant message it chose."""

    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    reply: Message

    @model_validator(mode="after")
    def _reply_is_assistant(self) -> Demonstration:
        if self.reply.role != "assistant":
            raise ValueError("reply must be an assistant message")
        return self


class EpisodeCreate(_Strict):
    task: Task = Field(default_factory=Task)
    agent: str = Field(default="main", description="agent name recorded on calls that do not name one")
    trainable: bool = Field(default=True, description="default for calls of this episode")


class EpisodeFinish(_Strict):
    outcome: Outcome = Field(default_factory=Outcome)
    status: Literal["finished", "failed"] = "finished"
    failure_reason: str | None = None


def _canonical_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except json.JSONDecodeError:
        return text
