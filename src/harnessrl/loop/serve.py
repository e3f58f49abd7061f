"""Serving a registry: the gateway follows PROMOTED, swapping versions without failing a request.

`harnessrl serve --registry DIR` loads the promoted version and polls PROMOTED (`poll` seconds);
when it names another version, that version is loaded in a worker thread and swapped in between two
requests (gateway/serving.py): requests already running finish on the version they started on and
record it; the next ones get the new version. PROMOTED is read again once it loaded: one rolled back
meanwhile is never swapped in. One that fails to load is tried again every 30 s.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI

from harnessrl.loop.registry import Registry

log = logging.getLogger("harnessrl.loop")


def follow(
    registry: Registry,
    serving_id: str,
    max_batch: int = 64,
    tool_format: str = "auto",
    prefix_cache: int = 0,
    poll: float = 0.1,
    retry: float = 30.0,
):
    """A gateway background task: swap in whatever version PROMOTED names. `serving_id`: the version
    loaded at start (PROMOTED may have moved while it loaded: then the next poll swaps). A version that
    does not load is logged and tried again every `retry` seconds while PROMOTED names it."""

    async def run(app: FastAPI) -> None:
        serving, current, failed = app.state.serving, serving_id, {}  # failed: version -> when to try again
        while True:
            await asyncio.sleep(poll)
            try:
                target = await asyncio.to_thread(registry.promoted)
            except OSError as exc:  # a registry on a flaky disk: keep serving, read again
                log.error("cannot read %s/PROMOTED (%s); still serving %s", registry.root, exc, current)
                await asyncio.sleep(retry)
                continue
            if not target or target == current or time.monotonic() < failed.get(target, 0.0):
                continue
            try:
                policy = await asyncio.to_thread(registry.load, target, max_batch, tool_format, prefix_cache)
            except Exception as exc:  # a bad version keeps the current one serving
                failed[target] = time.monotonic() + retry
                log.error("PROMOTED names %s, which does not load (%s: %s); still serving %s, trying again in %.0f s",
                          target, type(exc).__name__, exc, current, retry)  # fmt: skip
                continue
            try:  # a promotion or rollback while it loaded: not swapped in, the next poll loads what PROMOTED names
                moved = await asyncio.to_thread(registry.promoted) != target
            except OSError:
                moved = True
            if moved:
                policy.close()
                continue
            serving.swap(policy)
            log.warning("now serving %s (was %s)", target, current)
            current = target
            failed.pop(target, None)

    return run
