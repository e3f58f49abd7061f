"""Weights that change over training steps: constant, linear, cosine, step, anneal to zero by N."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Schedule(BaseModel):
    """value(step). linear / cosine go from `start` at step 0 to `end` at `steps` and stay there;
    step holds `start` until each boundary in `boundaries`, then the matching entry of `values`."""

    model_config = ConfigDict(extra="forbid")
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


def constant(value: float) -> Schedule:
    return Schedule(kind="constant", start=value)


def anneal_to_zero(start: float, by_step: int, kind: Literal["linear", "cosine"] = "linear") -> Schedule:
    """An auxiliary term that helps early and must not be farmed later (Kimi's spawn reward)."""
    return Schedule(kind=kind, start=start, end=0.0, steps=by_step)
