"""Serving a registry: the gateway follows PROMOTED, swapping versions without failing a request.

`harnessrl serve --registry DIR` loads the promoted version and polls PROMOTED (`poll` seconds);
when it names another version, that version is loaded in a worker thread and swapped in between two
requests (gateway/serving.py): requests already running finish on the version they started on and
record it; the next ones get the new version.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI

from harnessrl.loop.registry import Registry

log = logging.getLogger("harnessrl.loop")


def follow(
    registry: Registry, max_batch: int = 64, tool_format: str = "auto", prefix_cache: int = 0, poll: float = 0.1
):
    """A gateway background task: swap in whatever version PROMOTED names."""

    async def run(app: FastAPI) -> None:
        serving = app.state.serving
        current = registry.promoted()
        while True:
            await asyncio.sleep(poll)
            target = await asyncio.to_thread(registry.promoted)
            if not target or target == current:
                continue
            try:
                policy = await asyncio.to_thread(registry.load, target, max_batch, tool_format, prefix_cache)
            except Exception as exc:  # a bad version keeps the current one serving; logged, not retried
                log.error("PROMOTED names %s, which does not load (%s: %s); still serving %s", target,
                          type(exc).__name__, exc, current)  # fmt: skip
            else:
                serving.swap(policy)
                log.warning("now serving %s (was %s)", target, current)
            current = target

    return run
