"""Weights that change over training steps: constant, linear, cosine, step, anneal to zero by N."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Schedule(BaseModel):
    """value(step). linear / cosine go from `start` at step 0 to `end` at `steps` and stay there;
    step holds `start` until each boundary in `boundaries`, then the matching entry of `values`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a NaN weight would make every reward NaN
    kind: Literal["constant", "linear", "cosine", "step"] = "constant"
    start: float = 1.0
    end: float = 0.0
    steps: int = Field(default=1, ge=1)
    boundaries: list[int] = Field(default_factory=list)
    values: list[float] = Field(default_factory=list)

    @model_validator(mode="after")
    def _step_lists(self) -> Schedule:
        if len(self.boundaries) != len(self.values) or self.boundaries != sorted(self.boundaries):
            raise ValueError("boundaries must be ascending and as many as values")
        # a field the kind does not read would be ignored: `{start: 1, end: 0, steps: 100}` without `kind` was a
        # constant 1. A field at its default is let through: a schedule dumped whole (a run's config.yaml) has them all
        unread = [name for name, field in _FIELDS.items() if name not in _READS[self.kind]
                  and getattr(self, name) != field.get_default(call_default_factory=True)]  # fmt: skip
        if unread:
            unset = " (kind is constant when not given)" * ("kind" not in self.model_fields_set)
            raise ValueError(
                f"a {self.kind} schedule reads {', '.join(_READS[self.kind])}, not {', '.join(unread)}{unset}"
            )
        return self

    def value(self, step: int) -> float:
        progress = min(1.0, max(0, step) / self.steps)
        if self.kind == "constant":
            return self.start
        if self.kind == "linear":
            return self.start + (self.end - self.start) * progress
        if self.kind == "cosine":
            return self.end + (self.start - self.end) * 0.5 * (1 + math.cos(math.pi * progress))
        current = self.start
        for boundary, value in zip(self.boundaries, self.values):
            if step >= boundary:
                current = value
        return current


_READS = {"constant": ("start",), "linear": ("start", "end", "steps"), "cosine": ("start", "end", "steps"),
          "step": ("start", "boundaries", "values")}  # fmt: skip
_FIELDS = {n: f for n, f in Schedule.model_fields.items() if n != "kind"}


def constant(value: float) -> Schedule:
    return Schedule(kind="constant", start=value)


def anneal_to_zero(start: float, by_step: int, kind: Literal["linear", "cosine"] = "linear") -> Schedule:
    """An auxiliary term that helps early and must not be farmed later (Kimi's spawn reward)."""
    return Schedule(kind=kind, start=start, end=0.0, steps=by_step)
