"""The async rollout engine: groups of G episodes per task, run by the user's harness through the
gateway, scored, and fed to the trainer — synchronously (staleness 0) or while it trains (k > 0).

An episode is: create it on the gateway, run `harness(task, llm)` with `llm` bound to it under a
timeout, finish it with the outcome or the failure's reason, read it back, delete it. A harness that
raises or times out yields a failed episode scored `failure_reward` (a negative reward by default:
filtering failures out would teach the model to fail on purpose). With staleness k > 0 rollouts go
on while the trainer updates, at most k updates' worth of groups ahead, taken in the order they started,
so each is trained on within k versions; a group with a call older than that is dropped and counted.
With `backend: ray` the harness runs on Ray actors instead (rollout/ray_backend.py); everything
else here is the same, and an episode whose worker died is retried on a fresh episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harnessrl.gateway import GatewayClient, GatewayError
from harnessrl.harness import Harness
from harnessrl.rewards import Reward
from harnessrl.rollout.ray_backend import WorkerDied, WorkerSetupError
from harnessrl.types import Episode, RewardBreakdown, Task


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    group_size: int = Field(default=8, ge=2, description="episodes per task (G)")
    groups_per_update: int = Field(default=4, ge=1, description="groups in one trainer update")
    concurrency: int = Field(
        default=32, ge=1, description="episodes in flight at once (ray: at most workers x worker_concurrency)"
    )
    staleness: int = Field(default=0, ge=0, description="k: 0 = synchronous; k > 0 = rollouts continue during updates")
    episode_timeout: float = Field(default=120.0, gt=0, description="seconds before a harness run is a failed episode")
    failure_reward: float = Field(default=-1.0, description="reward of a failed episode (raised, timed out)")
    refill_rounds: int = Field(
        default=0,
        ge=0,
        description="DAPO's dynamic sampling: while fewer than groups_per_update groups of a batch are informative "
        "(the trainer would drop them as tied), sample up to this many more rounds of groups_per_update groups; "
        "the update trains on every informative one",
    )
    backend: Literal["local", "ray"] = Field(
        default="local", description="local: harnesses run in this process; ray: on Ray actors (rollout/ray_backend.py)"
    )
    ray_address: str | None = Field(default=None, description="ray: a cluster's address ('auto'); None starts one here")
    workers: int = Field(default=2, ge=1, description="ray: rollout worker actors")
    worker_concurrency: int = Field(default=8, ge=1, description="ray: episodes one worker runs at once")
    worker_retries: int = Field(default=1, ge=0, description="ray: fresh attempts for an episode whose worker died")


class RolloutEngine:
    def __init__(
        self,
        gateway: GatewayClient,
        harness: Harness,
        reward: Reward,
        config: RolloutConfig | None = None,
        guides: Mapping[str, Episode] | None = None,
    ):
        """`guides`: an expert's demonstration by task id; each group of such a task gets a copy beside its G
        sampled episodes, scored with them (LUFFY's off-policy guidance; `TrainConfig.guidance`)."""
        self.gateway, self.harness, self.reward, self.guides = gateway, harness, reward, guides or {}
        self.config = cfg = config or RolloutConfig()
        # on Ray, no more in flight than the workers run at once: a queued episode's timeout would already be running
        in_flight = (
            min(cfg.concurrency, cfg.workers * cfg.worker_concurrency) if cfg.backend == "ray" else cfg.concurrency
        )
        self._slots = asyncio.Semaphore(in_flight)
        self.counts = {"episodes": 0, "failed": 0, "timeouts": 0, "dropped_stale": 0, "expired": 0}
        self._ray = None
        if cfg.backend == "ray":  # the default backend never imports Ray
            from harnessrl.rollout.ray_backend import RayRunner

            self._ray = RayRunner(harness, gateway.base_url, cfg.workers, cfg.worker_concurrency, cfg.ray_address)
            self.counts |= {"worker_deaths": 0, "worker_retries": 0}

    def _run(self, task: Task, key: str):
        return self.harness(task, self.gateway.openai(key)) if self._ray is None else self._ray(task, key)

    async def episode(self, task: Task) -> Episode:
        async with self._slots:
            for attempt in range(self.config.worker_retries + 1 if self._ray else 1):
                episode = await self._attempt(task, retry=attempt < self.config.worker_retries)
                if episode is not None:
                    break
                self.counts["worker_retries"] += 1
        self.counts["episodes"] += 1
        self.counts["failed"] += episode.status == "failed"
        return episode

    async def _attempt(self, task: Task, retry: bool) -> Episode | None:
        """One run of the harness on a fresh gateway episode; None when its worker died and it may be retried."""
        episode_id, key = await self._create(task)
        deadline = asyncio.timeout(self.config.episode_timeout)
        try:
            async with deadline:
                outcome = await self._run(task, key)
        except WorkerSetupError:  # every episode would fail alike: stop, naming why
            raise
        except WorkerDied as exc:
            self.counts["worker_deaths"] = self._ray.deaths  # workers, not the episodes that saw one die
            if retry:  # this attempt's episode is deleted below: its partial calls are never trained on
                return None
            return await self._finish(episode_id, task, failure_reason=str(exc))
        except TimeoutError as exc:
            if not deadline.expired():  # the harness's own (a socket's, its wait_for's): its failure, not ours
                return await self._finish(episode_id, task, failure_reason=f"harness raised TimeoutError: {exc}")
            self.counts["timeouts"] += 1
            return await self._finish(episode_id, task, failure_reason=f"timeout after {self.config.episode_timeout} s")
        except Exception as exc:  # the harness's bug is a failed episode with its reason
            return await self._finish(episode_id, task, failure_reason=f"harness raised {type(exc).__name__}: {exc}")
        else:  # outside the excepts: the gateway's error at finish is not the harness's (it ends the run, as any)
            return await self._finish(episode_id, task, outcome)
        finally:
            try:
                await self.gateway.delete(episode_id)
            except GatewayError as exc:
                if exc.status != 404:  # 404: a session TTL expired it (below)
                    raise

    async def _create(self, task: Task) -> tuple[str, str]:
        """A gateway episode for `task`; one whose caller is cancelled meanwhile (a sibling's failure ended its
        group) is still created, then deleted: a cancelled group leaves nothing running on the gateway."""
        creating = asyncio.ensure_future(self.gateway.create_episode(task))
        try:
            return await asyncio.shield(creating)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self.gateway.delete((await creating)[0])
            raise

    async def _finish(self, episode_id: str, task: Task, outcome=None, failure_reason: str | None = None) -> Episode:
        """The gateway's record of the finished episode. A session TTL that expired it while the harness was idle
        has ended it already (409: its record, failed as expired) or, where the gateway keeps a trace store, moved
        it there (404: a failed episode without its calls, saying so): one lost episode never stops a run."""
        try:
            return await self.gateway.finish(episode_id, outcome, failure_reason)
        except GatewayError as exc:
            if exc.status not in (404, 409):
                raise
            self.counts["expired"] += 1
            if exc.status == 409:
                return await self.gateway.episode(episode_id)
            why = f"gone from the gateway (a session TTL expired it?) when the harness ended ({failure_reason or 'finished'})"
            return Episode(id=episode_id, task=task, status="failed", failure_reason=why)

    def close(self) -> None:
        """Stop the Ray workers (nothing to do for the local backend)."""
        if self._ray is not None:
            self._ray.close()

    async def group(self, task: Task, step: int = 0) -> list[Episode]:
        """G episodes of one task (and its guide, if any), scored."""
        episodes = await _all(self.episode(task) for _ in range(self.config.group_size))
        if (guide := self.guides.get(task.id)) is not None:
            episodes.append(guide.model_copy(update={"id": uuid.uuid4().hex}, deep=True))
        await self.score(episodes, step)
        return episodes

    async def score(self, episodes: list[Episode], step: int = 0) -> None:
        """Score one task's episodes as a group; failed ones get `failure_reward`."""
        finished = [e for e in episodes if e.status == "finished"]
        if finished:
            await self.reward.score_group(finished, step)
        penalty = self.config.failure_reward
        for e in episodes:
            if e.status == "failed":
                e.reward = RewardBreakdown(
                    total=penalty,
                    terms={"failure": penalty},
                    weights={"failure": 1.0},
                    values={"failure": penalty},
                    flags=["failed"],
                )

    async def train(
        self,
        trainer,
        tasks: Iterator[Task],
        updates: int,
        progress: bool = True,
        on_update: Callable[[dict, list[Episode]], bool | None] | None = None,
        batch_metrics: Callable[[list[Episode], int], dict[str, float]] | None = None,
    ) -> list[dict]:
        """`updates` trainer updates on groups collected from `tasks` (cycled by the caller).

        `on_update(metrics, episodes)` runs after each update with the episodes it trained on (every group of the
        batch, tied ones too), in a thread, while rollouts go on (checkpoints, the job's rollouts/); when it returns
        True, training stops after that update (a job's time budget);
        `batch_metrics(episodes, step)` adds the harness's own metrics of each batch (a swarm's).
        """
        cfg, history = self.config, []
        queue: asyncio.Queue[asyncio.Task] = asyncio.Queue()  # groups in the order they started
        # admission (as AReaL): at most k x groups_per_update groups started and not yet taken by the trainer, and
        # taken in the order they started, so a group waits behind at most k - 1 updates' worth of groups started
        # before it and is trained on within k versions of its start (none sampled in vain). Taken as they finish,
        # a slow group would be overtaken, go stale and be dropped: training would lean to short episodes.
        self._outstanding, self._taken = 0, asyncio.Event()
        running: set[asyncio.Task] = set()

        async def produce() -> None:  # ends only by failing (the tasks ran out): the groups it started run on
            while True:
                while self._outstanding < cfg.staleness * cfg.groups_per_update:
                    group = asyncio.create_task(self.group(_next(tasks), trainer.step))
                    running.add(group)
                    group.add_done_callback(running.discard)
                    queue.put_nowait(group)
                    self._outstanding += 1
                self._taken.clear()
                await self._taken.wait()

        producer = asyncio.create_task(produce()) if cfg.staleness > 0 else None
        bar = Progress(
            TextColumn("rl"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            disable=not progress,
        )
        with bar:
            job = bar.add_task("updates", total=updates, status="")
            try:
                for _ in range(updates):
                    started = time.perf_counter()
                    batch = await self._batch(queue, trainer, tasks, producer)
                    waited = time.perf_counter() - started
                    extra = {f"rollout/total_{k}": v for k, v in self.counts.items()} | {
                        "perf/rollout_wait_seconds": waited
                    }
                    if batch_metrics is not None:
                        extra |= batch_metrics([e for g in batch for e in g if not e.demonstrated], trainer.step)
                    metrics = await asyncio.to_thread(trainer.rl_step, batch, extra)
                    history.append(metrics)
                    stop = on_update is not None and await asyncio.to_thread(
                        on_update, metrics, [e for g in batch for e in g]
                    )
                    bar.update(job, advance=1, status=f"reward {metrics.get('reward/mean', float('nan')):.3f}")
                    if stop is True:
                        break
            finally:
                if producer is not None:
                    producer.cancel()
                    await asyncio.gather(producer, return_exceptions=True)
                for group in list(running):  # stopping: abandon groups in flight (their episodes are still deleted)
                    group.cancel()
                await asyncio.gather(*running, return_exceptions=True)
        return history

    async def _batch(
        self, queue: asyncio.Queue, trainer, tasks: Iterator[Task], producer: asyncio.Task | None
    ) -> list[list[Episode]]:
        cfg = self.config
        batch: list[list[Episode]] = []

        def short() -> bool:  # refills: more groups while too few are informative, at most refill_rounds rounds
            if len(batch) >= (1 + cfg.refill_rounds) * cfg.groups_per_update:
                return False
            return len(batch) < cfg.groups_per_update or sum(map(trainer.informative, batch)) < cfg.groups_per_update

        while producer is None and short():  # synchronous: collect a round, then train
            drawn = [_next(tasks) for _ in range(cfg.groups_per_update)]  # all first: none starts if they ran out
            batch += await _all(self.group(task, trainer.step) for task in drawn)
        while producer is not None and short():
            getter = asyncio.ensure_future(queue.get())
            if queue.empty():  # every group started is taken: wait for the next, or for the producer's failure
                await asyncio.wait([getter, producer], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():  # the tasks ran out: say so
                    getter.cancel()
                    producer.result()
                    raise RuntimeError("the rollout producer stopped")
            group = await (await getter)  # the oldest group started; its failure (a gateway error) ends training
            self._outstanding -= 1
            self._taken.set()
            current = trainer.policy.version if trainer.policy is not None else 0
            if stale := _stale_episodes(group, current, cfg.staleness):
                self.counts["dropped_stale"] += stale
                continue
            batch.append(group)
        return batch


def _next(tasks: Iterator[Task]) -> Task:
    """The next task; an iterator that ends is named (a StopIteration inside a coroutine is an unreadable error)."""
    try:
        return next(tasks)
    except StopIteration:
        raise RuntimeError(
            "the tasks iterator is exhausted before the last update: pass one that never ends (itertools.cycle(tasks))"
        ) from None


def _stale_episodes(group: list[Episode], current: int, staleness: int) -> int:
    """The sampled episodes of a group with a call older than `staleness` versions (0: the group is fresh). Frozen
    models never age; a demonstration was never sampled: neither its age nor itself counts."""
    versions = [c.policy_version for e in group for c in e.calls if c.trainable and not c.demonstration]
    if not versions or min(versions) >= current - staleness:
        return 0
    return sum(not e.demonstrated for e in group)


async def _all(coroutines) -> list:
    """asyncio.gather's results; where one raises, the others are cancelled (their gateway episodes deleted as they
    unwind) and awaited before its exception goes on: nothing runs on for a group no one will score."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
