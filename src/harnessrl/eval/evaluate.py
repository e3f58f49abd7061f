"""Benchmark evaluation (`harnessrl eval`): an environment's harness on every task of a split, N
times each, through the gateway and the rollout engine exactly as in training; every metric's mean
with a 95% confidence interval.

Per episode (`episode_metrics`, stored in `Episode.metrics`):

    success          1 when the harness reported success; a failed episode (raised, timed out) is 0
    failed           1 when the episode failed
    reward           the environment's reward, scored at the end of its schedules (so checkpoints
                     compare under one formula); a failed episode gets the rollout's failure_reward
    reward/<term>    each weighted term of the breakdown; a term an episode lacks counts 0
    term/<term>      each term before weighting (a term at weight 0 still measured)
    steps            model calls, all agents
    critical_steps   the longest chain of calls, each starting after the previous one ended
    context_tokens   the largest prompt + completion of one call
    tool_errors      malformed tool calls + `error:` observations (see `tool_errors`)
    rare_draws       tokens the policy sampled at probability < 1 % (the tail of a T = 1 sample;
                     0 when greedy); eval.json's `rare_draws` splits success by episodes with none
                     and with some, how much of the gap between sampled and greedy success they explain
    error/<class>    1 for the episode's error class, where the environment classifies failures
                     (search: envs/search/errors.py; "ok" for a success); eval.json's
                     `error_classes` counts episodes per class
    latency_seconds  the episode's wall time, gateway create -> harness -> finish, at the run's load

eval.json's `by_gold_docs` gives success per number of gold documents a task needs (search: a
lookup vs a chain of hops), where the tasks name them; `by_family` per task family (a task file's
`family`, e.g. its question template), where the tasks carry one: a gain on one kind of question
bought with a loss on another shows there and nowhere else.

Intervals: percentile bootstrap over tasks (`bootstrap_ci`); the repeats of a task stay together.

Knows environments, harnesses, rewards, the gateway and the rollout engine; knows nothing about
training.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from harnessrl.eval.heldout import HELDOUT_TIMEOUT
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.harness import Harness
from harnessrl.job.config import JobConfig
from harnessrl.policy.sources import PRESETS, SHIPPED
from harnessrl.rewards import Reward
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.train.checkpoint import latest_checkpoint
from harnessrl.types import Call, Episode, Task, read_jsonl

ADMIN = "harnessrl-eval-admin"
SCHEDULE_END = 10**9  # a step past every schedule's end: rewards at their final formula
CI_LEVEL, CI_RESAMPLES = 0.95, 2000
CI_METHOD = f"percentile bootstrap over tasks ({CI_RESAMPLES} resamples, seed 0)"


class CheckpointError(ValueError):
    """--checkpoint names nothing loadable; the message lists what was looked for."""


class EvalRequest(BaseModel):
    """What `harnessrl eval` was asked for, validated once."""

    model_config = ConfigDict(extra="forbid")
    env: str = Field(description="an environment of ENVS")
    split: Literal["train", "test"] = "test"
    checkpoint: str = Field(
        description="model folder, run folder, checkpoints/ folder, 'tiny-base', a preset or a .gguf file"
    )
    repeats: int = Field(default=1, ge=1, description="episodes per task")
    temperature: float = Field(default=1.0, ge=0, description="sampling temperature; 0 = greedy")
    concurrency: int = Field(default=32, ge=1, description="episodes in flight at once")
    seed: int = 0
    corpus: Path | None = Field(default=None, description="corpus JSONL; overrides the job config's")
    tasks: Path | None = Field(default=None, description="tasks JSONL; overrides the job config's")
    job: JobConfig = Field(default_factory=JobConfig, description="agent settings, data, rollout timeout")
    baseline: Path | None = Field(
        default=None,
        description="episodes JSONL of the same tasks evaluated before (an eval's episodes.jsonl, a job's "
        "eval_before.jsonl): eval.json's `gain_vs_baseline` is the success gain over it, paired by task",
    )

    @model_validator(mode="after")
    def _known(self) -> EvalRequest:
        if self.env not in ENVS:
            raise ValueError(f"--env {self.env!r}: unknown; known: {', '.join(sorted(ENVS))}")
        if (self.corpus is None) != (self.tasks is None):
            raise ValueError("--corpus and --tasks go together")
        if self.env == "search" and (job := "swarm" if self.job.swarm else "code" if self.job.code else None):
            # its model would run as the search agent, and its figures would read as that job's
            raise ValueError(
                f"--env search: the job config sets {job}: (the {job} job); its model is no search agent, and its "
                "run folder holds its own held-out evals (eval_before.json, eval_after.json)"
            )
        return self


@dataclass
class EvalEnv:
    """What an environment hands the evaluator: the harness, the split's tasks, the reward."""

    harness: Harness
    tasks: list[Task]
    reward: Reward
    error_class: Callable[[Episode], str] | None = None  # why an episode failed ("ok" when it did not)


def _search_env(request: EvalRequest, workdir: Path) -> EvalEnv:
    from harnessrl.envs.search import (
        SearchAgent,
        SearchIndex,
        load,
        synthetic,
    )
    from harnessrl.envs.search.errors import error_class

    data, a = request.job.data, request.job.agent
    corpus, tasks = request.corpus or data.corpus, request.tasks or data.tasks
    docs, items = (
        load(corpus, tasks) if corpus and tasks else synthetic(data.synthetic_seed, people=data.synthetic_people)
    )
    index = SearchIndex(docs, workdir / "index", source=str(corpus or "the synthetic corpus"))
    agent = SearchAgent(
        index,
        a.context_budget,
        a.max_turns,
        a.k,
        a.max_tokens,
        temperature=request.temperature,
    )
    split = [t.task() for t in items if t.split == request.split]
    documents = {d.id: d for d in docs}
    return EvalEnv(agent, split, request.job.reward.build(), lambda e: error_class(e, documents))


ENVS: dict[str, Callable[[EvalRequest, Path], EvalEnv]] = {"search": _search_env}


# ---- checkpoints ------------------------------------------------------------------------------


def resolve_checkpoint(checkpoint: str) -> str:
    """The model behind --checkpoint: 'tiny' / a shipped base / a preset / a .gguf file as they are, else
    the first folder with a config.json among DIR, DIR/model (an SFT run's final weights), DIR/best (the
    checkpoint a job kept on validation: its summary's "after"), DIR/.best.old (best/ where a kill came between
    moving it aside and putting the new one in place; the job takes it back too), the step DIR/latest names (a
    checkpoints/ folder), the step DIR/checkpoints/latest names (a run folder without best/) and the step
    DIR/sft/checkpoints/latest names (a job that ended on its SFT weights: no RL update, no validation)."""
    if checkpoint in ("tiny", *SHIPPED, *PRESETS) or checkpoint.endswith(".gguf"):
        return checkpoint
    path = Path(checkpoint)
    if not path.is_dir():
        raise CheckpointError(f"--checkpoint {checkpoint}: no such folder (nor 'tiny-base')")
    # the step `latest` names, or the newest complete one where a kill left `latest` naming none
    candidates = [path, path / "model", path / "best", path / ".best.old", latest_checkpoint(path)]
    candidates += [latest_checkpoint(path / "checkpoints"), latest_checkpoint(path / "sft" / "checkpoints")]
    for candidate in candidates:
        if candidate is not None and (candidate / "config.json").is_file():
            return str(candidate)
    raise CheckpointError(
        f"--checkpoint {checkpoint}: no model folder: looked for config.json in it, in model/, "
        "in best/ (and .best.old/), and in the step named by latest, checkpoints/latest or sft/checkpoints/latest"
    )


# ---- per-episode metrics ------------------------------------------------------------------------


def critical_steps(calls: list[Call]) -> int:
    """The longest chain of calls in which each starts after the previous one ended.

    One agent's calls follow each other, so a single agent's count is its number of calls.
    Sub-agents running in parallel overlap in time, so a stage costs the orchestrator's calls plus
    the longest sub-agent's only: Kimi K2.5's sum over stages of S_main + max_i S_sub,i, read off the
    calls' timestamps, whatever the agents are called (parallel sub-agents may share a name).
    """
    ordered = sorted(calls, key=lambda c: c.ended_at)
    chain: list[int] = []  # chain[i]: the longest chain that ends with ordered[i]
    for i, call in enumerate(ordered):
        before = [chain[j] for j in range(i) if ordered[j].ended_at <= call.started_at]
        chain.append(1 + max(before, default=0))
    return max(chain, default=0)


_ERROR_LINE = re.compile(r"^error:", re.MULTILINE)


def tool_errors(calls: list[Call], decode: Callable[[list[int]], str]) -> int:
    """Malformed tool calls (`Call.tool_call_error`) plus observations that begin a line with
    `error:` (the Toolbox's convention: unknown tool, bad arguments, raised, timed out) among what
    a call's prompt adds to its agent's previous call. When the prompt extends that call, that is
    the new tokens; after a history edit it is the growth in such lines, less the previous
    completion's own. Observations no later call saw (after an agent's last call) are not counted.
    """
    count = sum(c.tool_call_error is not None for c in calls)
    last: dict[str, int] = {}  # agent -> index of its latest call
    for i, call in enumerate(calls):
        if call.extends_call is not None:
            prev = calls[call.extends_call]
            added = call.prompt_ids[len(prev.prompt_ids) + len(prev.completion_ids) :]
            count += _errors(decode(added))
        elif call.agent in last:
            prev = calls[last[call.agent]]
            seen = _errors(decode(prev.prompt_ids)) + _errors(decode(prev.completion_ids))
            count += max(0, _errors(decode(call.prompt_ids)) - seen)
        last[call.agent] = i
    return count


def _errors(text: str) -> int:
    return len(_ERROR_LINE.findall(text))


def episode_metrics(episode: Episode, decode: Callable[[list[int]], str]) -> dict[str, float]:
    """Every metric of one episode but latency (which only the runner can time)."""
    calls, reward = episode.calls, episode.reward
    terms, values = (reward.terms, reward.values) if reward else ({}, {})
    sizes = [len(c.prompt_ids) + len(c.completion_ids) for c in calls]
    return {
        "success": float(episode.succeeded),
        "failed": float(episode.status == "failed"),
        "reward": reward.total if reward else 0.0,
        **{f"reward/{name}": value for name, value in terms.items()},
        **{f"term/{name}": value for name, value in values.items()},
        "steps": float(len(calls)),
        "critical_steps": float(critical_steps(calls)),
        "context_tokens": float(max(sizes, default=0)),
        "tool_errors": float(tool_errors(calls, decode)),
        "rare_draws": float(rare_draws(calls)),
    }


RARE = math.log(0.01)


def policy_draws(calls: list[Call]) -> list[float]:
    """The recorded logprob of every token the trainable policy sampled (demonstrations and frozen
    sub-agents left out; a greedy call records 0.0)."""
    return [lp for c in calls if c.trainable and not c.demonstration for lp in c.sampled_logprobs]


def rare_draws(calls: list[Call]) -> int:
    """Tokens the trainable policy sampled at probability < 1 %."""
    return sum(lp < RARE for lp in policy_draws(calls))


def by_rare_draws(episodes: list[Episode]) -> dict[str, dict]:
    """eval.json's `rare_draws`: episodes without a rare draw and with one or more, and their success
    (a plain mean over episodes: a task's repeats fall on either side)."""
    sides = {"none": [e for e in episodes if not e.metrics.get("rare_draws")]}
    sides["some"] = [e for e in episodes if e.metrics.get("rare_draws")]
    return {
        side: {
            "episodes": len(group),
            "success": float(np.mean([e.metrics["success"] for e in group])) if group else None,
        }
        for side, group in sides.items()
    }


# ---- statistics -------------------------------------------------------------------------------


def bootstrap_ci(
    values: list[float],
    level: float = CI_LEVEL,
    resamples: int = CI_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval (Efron) of the mean of `values`: the (1 - level) / 2 and
    (1 + level) / 2 quantiles of the means of `resamples` draws with replacement. One value gives a
    zero-width interval."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), float(x.mean())
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(x), size=(resamples, len(x)))  # (R, n) task indices
    low, high = np.quantile(x[draws].mean(axis=1), [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def permutation_p(
    before: list[list[float]], after: list[list[float]], resamples: int = CI_RESAMPLES, seed: int = 0
) -> float:
    """One-sided p-value that the episodes' scores fell, per task (`before[i]`, `after[i]`: task i's): the share
    of `resamples` relabellings, each task's episodes shuffled between before and after (exchangeable where
    nothing changed), whose sum over tasks of (mean after - mean before) is as low as the observed one or lower;
    (1 + count) / (1 + resamples), so never 0. Unlike a bootstrap over tasks it keeps each task's own sampling
    noise: a task at 2 of 2 before and 1 of 2 after shows that fall in half of its relabellings."""
    rng = np.random.default_rng(seed)
    observed, permuted = 0.0, np.zeros(resamples)
    for b, a in zip(before, after):
        x = np.asarray(b + a, dtype=float)
        observed += float(np.mean(a) - np.mean(b))
        shuffled = x[rng.random((resamples, len(x))).argsort(axis=1)]
        permuted += shuffled[:, len(b) :].mean(axis=1) - shuffled[:, : len(b)].mean(axis=1)
    return float((1 + np.sum(permuted <= observed + 1e-9)) / (1 + resamples))


def succeeded(e: Episode) -> bool:
    """The default score of the intervals and alarms below: `Episode.succeeded`."""
    return e.succeeded


NO_SHARED_TASK = "--baseline: its episodes share no task with this evaluation (another split or corpus?)"


def gain_ci(before: list[Episode], after: list[Episode], score=succeeded) -> list[float]:
    """95 % percentile-bootstrap interval of the RL gain in the mean of `score` over episodes (success by
    default, or any number an episode gets: the swarm's item-F1), paired by task: each task's mean over its
    repeats after RL minus before, resampled over tasks; a ValueError where they share no task."""
    b, a = scores_by_task(before, score), scores_by_task(after, score)
    if not (gains := [sum(a[t]) / len(a[t]) - sum(b[t]) / len(b[t]) for t in b if t in a]):
        raise ValueError(NO_SHARED_TASK)
    low, high = bootstrap_ci(gains)
    return [round(low, 4), round(high, 4)]


def paired_gain(before: list[Episode], after: list[Episode]) -> dict:
    """Success after minus before on the tasks both evaluated: {tasks, success_before, success_after (means of the
    task means), ci (gain_ci)}; a ValueError where they share no task."""
    b, a = scores_by_task(before, succeeded), scores_by_task(after, succeeded)
    if not (shared := [t for t in a if t in b]):
        raise ValueError(NO_SHARED_TASK)

    def mean(scores: dict[str, list[float]]) -> float:
        return round(sum(sum(scores[t]) / len(scores[t]) for t in shared) / len(shared), 4)

    return {"tasks": len(shared), "success_before": mean(b), "success_after": mean(a), "ci": gain_ci(before, after)}


def scores_by_task(episodes: list[Episode], score) -> dict[str, list[float]]:
    """Each task's `score` of its episodes, in the order they come."""
    scores: dict[str, list[float]] = {}
    for e in episodes:
        scores.setdefault(e.task.id, []).append(float(score(e)))
    return scores


ALARM_P = 0.025  # one-sided, as the low end of a 95 % interval


def worse(before: list[Episode], after: list[Episode], score=succeeded, sign: float = 1.0) -> bool:
    """Whether `score` (times `sign`: -1 asks whether it rose) fell beyond noise, paired by task: a permutation
    test of each task's episodes (`permutation_p`), which a task at its ceiling before cannot fool."""
    b, a = scores_by_task(before, score), scores_by_task(after, score)
    tasks = [t for t in b if t in a]
    signed = [[sign * v for v in b[t]] for t in tasks], [[sign * v for v in a[t]] for t in tasks]
    return bool(tasks) and permutation_p(*signed) < ALARM_P


def falling(runs: dict[str, dict[str, list[Episode]]], score=succeeded) -> list[str]:
    """`NAME_falling` for each of the runs (name -> {"before": episodes, "after": episodes}) whose `score` fell
    beyond noise (`worse`)."""
    return [f"{name}_falling" for name, eps in runs.items() if worse(eps["before"], eps["after"], score)]


def summarize(episodes: list[Episode]) -> dict[str, dict[str, float]]:
    """Per metric: the mean over tasks of each task's mean over its repeats, and its 95% interval."""
    by_task: dict[str, list[Episode]] = {}
    for e in episodes:
        by_task.setdefault(e.task.id, []).append(e)
    names = list(dict.fromkeys(name for e in episodes for name in e.metrics))
    fixed = [n for n in names if not n.startswith(("reward/", "term/"))]
    names = (
        fixed + sorted(n for n in names if n.startswith("reward/")) + sorted(n for n in names if n.startswith("term/"))
    )
    out = {}
    for name in names:
        per_task = [float(np.mean([e.metrics.get(name, 0.0) for e in group])) for group in by_task.values()]
        low, high = bootstrap_ci(per_task)
        out[name] = {"mean": float(np.mean(per_task)), "low": low, "high": high}
    return out


def reward_by_error_class(episodes: list[Episode], classes: list[str]) -> dict[str, float]:
    """eval.json's `reward_by_error_class`: the mean reward of the episodes of each error class, highest
    first. Whether the reward ranks the ways of failing as one would (a wrong answer after one search
    above one after the gold documents were found pays the agent for giving up early) is read here."""
    means = {}
    for name in classes:
        rewards = [e.metrics["reward"] for e in episodes if e.metrics.get(f"error/{name}")]
        means[name] = sum(rewards) / len(rewards)
    return dict(sorted(means.items(), key=lambda item: -item[1]))


def group_by_gold_docs(episodes: list[Episode]) -> dict[str, list[Episode]]:
    """Episodes by the number of gold documents their task needs ("1": a lookup, "2" and more:
    hops), fewest first; tasks that name none are left out."""
    groups: dict[int, list[Episode]] = {}
    for e in episodes:
        if n := len(e.task.data.get("gold_doc_ids", [])):
            groups.setdefault(n, []).append(e)
    return {str(n): groups[n] for n in sorted(groups)}


def group_by_family(episodes: list[Episode]) -> dict[str, list[Episode]]:
    """Episodes by their task's `family` (task data), in name order; tasks without one are left out."""
    groups: dict[str, list[Episode]] = {}
    for e in episodes:
        if family := e.task.data.get("family"):
            groups.setdefault(str(family), []).append(e)
    return dict(sorted(groups.items()))


def by_gold_docs(episodes: list[Episode]) -> dict[str, dict]:
    """eval.json's `by_gold_docs`: per group of `group_by_gold_docs`, its tasks and success (mean and
    interval as in `summarize`)."""
    return _success_by(group_by_gold_docs(episodes))


def by_family(episodes: list[Episode]) -> dict[str, dict]:
    """eval.json's `by_family`: `by_gold_docs` per task family (`group_by_family`)."""
    return _success_by(group_by_family(episodes))


def _success_by(groups: dict[str, list[Episode]]) -> dict[str, dict]:
    return {
        key: {"tasks": len({e.task.id for e in group}), "success": summarize(group)["success"]}
        for key, group in groups.items()
    }


# ---- the run ----------------------------------------------------------------------------------


async def run_episodes(gateway: GatewayClient, env: EvalEnv, repeats: int, rollout: RolloutConfig) -> list[Episode]:
    """`repeats` episodes of every task, `rollout.concurrency` in flight, scored per task at the end
    of the reward's schedules; each episode's wall seconds in `metrics["latency_seconds"]`."""
    engine = RolloutEngine(gateway, env.harness, env.reward, rollout)
    # slots taken here, not in the engine, so latency leaves out the wait for one
    slots = asyncio.Semaphore(rollout.concurrency)

    async def timed(task: Task) -> Episode:
        async with slots:
            started = time.perf_counter()
            episode = await engine.episode(task)
        episode.metrics["latency_seconds"] = time.perf_counter() - started
        return episode

    groups = await asyncio.gather(*(asyncio.gather(*(timed(t) for _ in range(repeats))) for t in env.tasks))
    for group in groups:  # as in training: a failed episode scores failure_reward
        await engine.score(group, SCHEDULE_END)
    return [e for group in groups for e in group]


def evaluate(request: EvalRequest, out: Path) -> dict:
    """Run the evaluation; write out/eval.json, out/eval.md, out/episodes.jsonl; return eval.json's data."""
    import torch

    from harnessrl.policy import Policy

    model = resolve_checkpoint(request.checkpoint)
    baseline = read_jsonl(request.baseline, Episode) if request.baseline is not None else None  # a bad file: fail now
    out.mkdir(parents=True, exist_ok=True)
    env = ENVS[request.env](request, out)
    if not env.tasks:
        raise ValueError(f"--env {request.env}: the {request.split} split has no tasks")
    if baseline is not None and not {t.id for t in env.tasks} & {e.task.id for e in baseline}:
        raise ValueError(f"{request.baseline}: {NO_SHARED_TASK}")
    torch.manual_seed(request.seed)
    policy = Policy.load(model, seed=request.seed, tool_format=request.job.tool_format)
    rollout = request.job.rl.rollout
    timeout = max(rollout.episode_timeout, HELDOUT_TIMEOUT)  # as the job's held-out eval, so figures agree
    rollout = rollout.model_copy(update={"concurrency": request.concurrency, "episode_timeout": timeout})
    started = time.perf_counter()
    try:
        episodes = asyncio.run(_run(policy, env, request.repeats, rollout))
        classes: Counter[str] = Counter()
        for e in episodes:
            e.metrics = episode_metrics(e, policy.decode) | e.metrics
            if env.error_class is not None:
                classes[name := env.error_class(e)] += 1
                e.metrics[f"error/{name}"] = 1.0
    finally:
        policy.close()
    report = {
        "env": request.env,
        "split": request.split,
        "checkpoint": request.checkpoint,
        "model": model,
        "temperature": request.temperature,
        "repeats": request.repeats,
        "tasks": len(env.tasks),
        "episodes": len(episodes),
        "ci": {"method": CI_METHOD, "level": CI_LEVEL},
        "metrics": summarize(episodes),
        "error_classes": dict(classes.most_common()),
        "reward_by_error_class": reward_by_error_class(episodes, list(classes)),
        "by_gold_docs": by_gold_docs(episodes),
        "by_family": by_family(episodes),
        "rare_draws": by_rare_draws(episodes),
        "wall_seconds": time.perf_counter() - started,
    }
    if baseline is not None:
        report["gain_vs_baseline"] = paired_gain(baseline, episodes) | {"baseline": str(request.baseline)}
    (out / "episodes.jsonl").write_text("".join(e.to_json() + "\n" for e in episodes))
    (out / "eval.json").write_text(json.dumps(report, indent=1))
    (out / "eval.md").write_text(markdown(report))
    return report


async def _run(policy, env: EvalEnv, repeats: int, rollout: RolloutConfig) -> list[Episode]:
    gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN))
    try:
        return await run_episodes(gateway, env, repeats, rollout)
    finally:
        await gateway.aclose()


def markdown(report: dict) -> str:
    """eval.json as a markdown table, with the run's facts above it."""
    r = report
    facts = (
        f"checkpoint `{r['checkpoint']}` (model `{r['model']}`), {r['tasks']} tasks x "
        f"{r['repeats']} repeats = {r['episodes']} episodes, temperature {r['temperature']}; "
        f"{r['ci']['level']:.0%} CI: {r['ci']['method']}"
    )
    lines = [
        f"# eval: {r['env']} / {r['split']}",
        "",
        facts,
        "",
        "| metric | mean | 95% CI |",
        "|---|---:|---|",
    ]
    for name, m in r["metrics"].items():
        lines.append(f"| {name} | {m['mean']:.4g} | [{m['low']:.4g}, {m['high']:.4g}] |")
    if g := r.get("gain_vs_baseline"):
        low, high = g["ci"]
        change = f"{g['success_before']:.3g} → {g['success_after']:.3g}, gain 95 % CI [{low:.3g}, {high:.3g}]"
        lines += ["", f"Success against `{g['baseline']}` on the {g['tasks']} tasks both evaluated: {change} (paired)."]
    if r.get("error_classes"):
        counts = ", ".join(f"{k} {v}" for k, v in r["error_classes"].items())  # most frequent first
        lines += ["", f"Episodes per error class: {counts}."]
        means = ", ".join(f"{k} {v:.3g}" for k, v in r["reward_by_error_class"].items())  # highest first
        lines += ["", f"Mean reward per error class: {means}."]
    for key, title, label in (
        ("by_gold_docs", "the gold documents a task needs", "{} gold doc(s)"),
        ("by_family", "task family", "{}"),
    ):
        if r.get(key):
            rows = "; ".join(
                f"{label.format(k)}, {g['tasks']} tasks: {g['success']['mean']:.3g} [{g['success']['low']:.3g}, {g['success']['high']:.3g}]"
                for k, g in r[key].items()
            )
            lines += ["", f"Success by {title}: {rows}."]
    if (rare := r.get("rare_draws")) and rare["some"]["episodes"]:
        side = {k: "-" if v["success"] is None else f"{v['success']:.3g}" for k, v in rare.items()}
        lines += ["", f"Success of episodes without a token sampled at p < 1 %: {side['none']} "
                  f"({rare['none']['episodes']} episodes); with one or more: {side['some']} ({rare['some']['episodes']})."]  # fmt: skip
    return "\n".join(lines) + "\n"
