"""Serve the gateway over real HTTP with uvicorn, in the foreground or on a background thread."""

from __future__ import annotations

import threading
import time

import uvicorn


class BackgroundServer:
    """uvicorn on its own thread and event loop; port 0 picks a free port. Use as a context manager."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        # the app's lifespan runs (startup before `started`, shutdown on exit): it starts the session expiry
        # and the `background=` tasks, which "off" would silently drop
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="harnessrl-gateway", daemon=True)

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.01)
        return self

    @property
    def base_url(self) -> str:
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
