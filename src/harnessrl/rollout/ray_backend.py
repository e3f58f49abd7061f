"""`rollout.backend: ray`: episodes run on Ray actors across a cluster, each calling the gateway over HTTP.

The engine keeps what it owns (creating, finishing and scoring episodes, staleness, timeouts); only
`harness(task, llm)` moves: a `RolloutWorker` actor runs it with an `openai.AsyncOpenAI` bound to the
episode's key and the gateway's HTTP address, up to `worker_concurrency` at once per worker, and
returns the Outcome. Workers are picked least-loaded first.

A worker that dies (its process killed, out of memory, its node lost) is a failed attempt, not a
crash: the engine deletes the attempt's episode on the gateway (its partial calls are never trained
on), replaces the worker, and retries with a fresh episode up to `worker_retries` times; after that
the episode fails with the reason. Ray's own task retries stay off: a retried actor task would call
the gateway again under the same episode key and duplicate calls.

Only this module imports Ray, and only when the ray backend is chosen.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

from harnessrl.harness import Harness
from harnessrl.types import Outcome, Task


class WorkerDied(RuntimeError):
    """The Ray worker running an episode died; the message says how."""


class WorkerSetupError(RuntimeError):
    """A Ray worker could not start (its harness does not load there): every episode would fail alike."""


def _worker_class():
    import ray

    @ray.remote(max_restarts=0, max_task_retries=0)
    class RolloutWorker:
        def __init__(self, harness: Harness, base_url: str, timeout: float):
            import openai

            self.harness, self.base_url = harness, base_url.rstrip("/") + "/v1"
            self.http = openai.DefaultAsyncHttpxClient(timeout=timeout)  # one pool for the worker's episodes

        async def run(self, task: str, api_key: str) -> str:
            import openai

            llm = openai.AsyncOpenAI(api_key=api_key, base_url=self.base_url, http_client=self.http, max_retries=0)
            outcome = await self.harness(Task.model_validate_json(task), llm)
            return (outcome or Outcome()).model_dump_json()  # None: no outcome, as in process (GatewayClient.finish)

        def pid(self) -> int:
            import os

            return os.getpid()

    return RolloutWorker


def _user_module(harness) -> ModuleType | None:
    """The module of the user's code behind a harness (a function, a method, a callable object, or a
    functools.partial of one), to ship by value: not harnessrl's, the standard library's or an installed package's,
    which the workers import themselves (registering functools, a partial's own module, broke its pickling)."""
    while isinstance(harness, functools.partial):
        harness = harness.func
    module = sys.modules.get(getattr(harness, "__module__", None) or type(harness).__module__)
    path = getattr(module, "__file__", None)
    if module is None or path is None or module.__name__.split(".")[0] == "harnessrl":
        return None
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return None if any(Path(path).resolve().is_relative_to(p) for p in installed) else module


class RayRunner:
    """Runs harnesses on `workers` Ray actors; `await runner(task, api_key)` -> Outcome."""

    def __init__(
        self,
        harness: Harness,
        base_url: str,
        workers: int = 2,
        worker_concurrency: int = 8,
        address: str | None = None,
        timeout: float = 600.0,
    ):
        import ray
        from ray import cloudpickle

        if base_url.startswith("http://harnessrl.local"):
            raise ValueError(
                "the ray backend needs the gateway over HTTP: GatewayClient(base_url=...) or BackgroundServer"
            )
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        if (module := _user_module(harness)) is not None:
            cloudpickle.register_pickle_by_value(module)  # a user's script or test module: ship its code
        self._ray, self._make = (
            ray,
            lambda: _worker_class().options(max_concurrency=worker_concurrency).remote(harness, base_url, timeout),
        )
        self.workers = [self._make() for _ in range(workers)]
        self.load = [0] * workers
        self.deaths = 0  # workers replaced (each death is seen by every episode it ran)

    async def __call__(self, task: Task, api_key: str) -> Outcome:
        slot = min(range(len(self.workers)), key=self.load.__getitem__)
        worker = self.workers[slot]
        self.load[slot] += 1
        ref = worker.run.remote(task.model_dump_json(), api_key)
        try:
            return Outcome.model_validate_json(await ref)
        except asyncio.CancelledError:  # a timeout: stop the harness on the worker too
            self._ray.cancel(ref)
            raise
        except self._ray.exceptions.RayTaskError as exc:  # the harness raised: the same as in process
            raise exc.cause if isinstance(exc.cause, Exception) else RuntimeError(str(exc)) from None
        except self._ray.exceptions.RayActorError as exc:
            if getattr(exc, "actor_init_failed", False):  # e.g. the harness's module does not import there
                raise WorkerSetupError(f"rollout worker {slot} could not start: {str(exc)[:600]}") from None
            if self.workers[slot] is worker:  # the first episode to notice replaces the worker
                self.workers[slot], self.load[slot] = self._make(), 0
                self.deaths += 1
                with contextlib.suppress(Exception):  # unavailable, not dead: it must not run on unseen
                    self._ray.kill(worker, no_restart=True)
            raise WorkerDied(f"rollout worker {slot} died: {type(exc).__name__}: {str(exc)[:300]}") from None
        finally:
            if self.workers[slot] is worker:
                self.load[slot] -= 1

    def close(self) -> None:
        for worker in self.workers:
            self._ray.kill(worker)
