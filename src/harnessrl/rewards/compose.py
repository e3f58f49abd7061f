"""Compose reward terms into a RewardBreakdown that names every term and its weight at this step.

A term is a plain function of an Episode (or, for group judges, an async function of the whole
group). Weights may follow schedules. A gated term counts only when another term passes; a capped
term never exceeds another term's weighted value (a judge cannot outscore the verified outcome).
Gates are applied before caps, and a cap reads the term it refers to after that term's own gate and
cap, so the order of the terms does not change the reward.
Detector terms also raise a flag when they fire, logged as `hacking/<flag>`. A reward with a clamp records what
the clamp took or added as the term `clamp` (0 where it did not bite), so the terms always sum to the total and a
penalty the clamp swallowed shows.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from harnessrl.rewards.schedules import Schedule, constant
from harnessrl.types import Episode, RewardBreakdown


class TermFailure(Exception):
    """A term could not be computed (e.g. a judge timed out, or it returned NaN or inf); the episode's group is
    excluded."""


@dataclass
class Term:
    name: str
    fn: Callable[[Episode], float] | Callable[[list[Episode]], Awaitable[list[float]]]
    weight: float | Schedule = 1.0
    group: bool = False  # fn takes the whole group (async), e.g. a group-relative judge
    gate: str | None = None  # counts only when this other term's raw value >= gate_threshold
    gate_threshold: float = 1.0
    cap: str | None = None  # weighted value capped at this other term's weighted value
    flag: bool = False  # a hacking detector: raw value != 0 raises flag `name`
    with_step: bool = False  # fn(episode, step), or fn(episodes, step) for a group term: the term changes over training

    def weight_at(self, step: int) -> float:
        return self.weight.value(step) if isinstance(self.weight, Schedule) else self.weight


class Reward:
    def __init__(self, terms: list[Term], clamp: tuple[float, float] | None = None):
        names = [t.name for t in terms]
        if len(set(names)) != len(names):
            raise ValueError(f"term names must be unique: {names}")
        for t in terms:
            for other in (t.gate, t.cap):
                if other is not None and other not in names:
                    raise ValueError(f"term {t.name!r} refers to unknown term {other!r}")
        _cap_depths(terms)  # a cycle of caps is refused now
        if clamp is not None and "clamp" in names:
            raise ValueError("a reward with a clamp records it as the term 'clamp': rename that term")
        for t in terms:  # a NaN or inf weight makes every total NaN, and the trainer drops every group as failed
            if not isinstance(t.weight, Schedule) and not math.isfinite(t.weight):
                raise ValueError(f"term {t.name!r}: weight {t.weight} is not a finite number")
        if clamp is not None and not (math.isfinite(clamp[0]) and math.isfinite(clamp[1]) and clamp[0] <= clamp[1]):
            raise ValueError(f"clamp {clamp} is not (low, high) with finite low <= high")
        self.terms, self.clamp = terms, clamp

    async def score_group(self, episodes: list[Episode], step: int = 0) -> list[RewardBreakdown]:
        """Score a group (one task, G episodes) and set each episode's `reward`."""
        raw: dict[str, list[float]] = {}
        failures = []  # every failed term, not the last only: each needs its own fix
        for term in self.terms:
            try:
                raw[term.name] = _finite(await _values(term, episodes, step))
            except TermFailure as exc:
                failures.append(f"{term.name}: {exc}")
                raw[term.name] = [0.0] * len(episodes)
            except Exception as exc:  # a bug in the term: it stops the run, saying which term
                exc.add_note(f"in reward term {term.name!r}")
                raise
        failure = "; ".join(failures) or None
        out = []
        for i, episode in enumerate(episodes):
            breakdown = self._combine({name: values[i] for name, values in raw.items()}, step, failure)
            episode.reward = breakdown
            out.append(breakdown)
        return out

    def score(self, episode: Episode, step: int = 0) -> RewardBreakdown:
        """Score one episode with per-episode terms only (no group judges)."""
        if any(t.group or inspect.iscoroutinefunction(t.fn) for t in self.terms):
            raise ValueError("this reward has group or async terms: use `await reward.score_group(...)`")
        raw, failures = {}, []
        for t in self.terms:
            try:
                raw[t.name] = _finite([_number(t.fn(episode, step) if t.with_step else t.fn(episode))])[0]
            except TermFailure as exc:
                failures.append(f"{t.name}: {exc}")
                raw[t.name] = 0.0
            except Exception as exc:
                exc.add_note(f"in reward term {t.name!r}")
                raise
        breakdown = self._combine(raw, step, "; ".join(failures) or None)
        episode.reward = breakdown
        return breakdown

    def _combine(self, raw: dict[str, float], step: int, failure: str | None) -> RewardBreakdown:
        weights = {t.name: t.weight_at(step) for t in self.terms}
        terms = {t.name: raw[t.name] * weights[t.name] for t in self.terms}
        for t in self.terms:  # a gate reads raw values, which nothing changes
            if t.gate is not None and raw[t.gate] < t.gate_threshold:
                terms[t.name] = 0.0
        depth = _cap_depths(self.terms)  # of the terms now (a caller may have appended one)
        for t in sorted(self.terms, key=lambda t: depth[t.name]):  # the capping term is final already
            if t.cap is not None:
                terms[t.name] = min(terms[t.name], terms[t.cap])
        total = sum(terms.values())
        if self.clamp is not None:  # in every breakdown, 0 included: `reward/clamp` is a mean over the scored episodes
            clamped = min(max(total, self.clamp[0]), self.clamp[1])
            terms["clamp"], total = clamped - total, clamped
        flags = [t.name for t in self.terms if t.flag and raw[t.name] != 0]
        return RewardBreakdown(total=total, terms=terms, weights=weights, values=raw, flags=flags, failure=failure)


def _cap_depths(terms: list[Term]) -> dict[str, int]:
    """How many caps lie above each term (a cap is applied after the one it reads); a cycle is a ValueError."""
    caps, depths = {t.name: t.cap for t in terms}, {}
    for t in terms:
        chain = [t.name]
        while caps.get(chain[-1]) is not None:
            chain.append(caps[chain[-1]])
            if chain[-1] in chain[:-1]:
                raise ValueError(f"caps form a cycle: {' -> '.join(chain)}")
        depths[t.name] = len(chain) - 1
    return depths


async def _values(term: Term, episodes: list[Episode], step: int) -> list[float]:
    if term.group:
        values = await (term.fn(episodes, step) if term.with_step else term.fn(episodes))
        if len(values) != len(episodes):
            raise TermFailure(f"returned {len(values)} scores for {len(episodes)} episodes")
        return [_number(v) for v in values]
    if inspect.iscoroutinefunction(term.fn):
        calls = (term.fn(e, step) if term.with_step else term.fn(e) for e in episodes)
        return [_number(v) for v in await asyncio.gather(*calls)]
    return [_number(term.fn(e, step) if term.with_step else term.fn(e)) for e in episodes]


def _number(value) -> float:
    """A term's value as a float (a bool counts 1 or 0); None (a branch that forgot its return) or a string is a
    TypeError: float("1") would let a str through."""
    if isinstance(value, str | bytes) or value is None:
        raise TypeError(f"returned {value!r}, not a number")
    return float(value)


def _finite(values: list[float]) -> list[float]:
    """The values, or TermFailure: one NaN or inf would make every advantage of its group NaN (or order-dependent)."""
    for v in values:
        if not math.isfinite(v):
            raise TermFailure(f"returned {v}, not a finite number")
    return values


def weighted(name: str, fn, weight: float | Schedule = 1.0, **kw) -> Term:
    """Shorthand: `weighted("format", check_format, anneal_to_zero(0.2, 500))`."""
    return Term(name, fn, weight if isinstance(weight, Schedule) else constant(weight), **kw)
