"""Promotion under load: the registry's atomic switch followed by a running server, vs restarting the server.

A `harnessrl serve --registry` on 127.0.0.1 serves tiny-base v1 while threads send chat calls
(each on its own episode) without pause. `hot`: PROMOTED is switched to v2 (`Registry.promote`, what
`harnessrl promote` runs) and we time until /health reports version 2, counting failed requests.
`restart` (the baseline without a hot swap): the server is stopped and started again on v2; we
time from the stop to its first answer, counting failed requests meanwhile.

    python benchmarks/promotion.py [--threads 4]

Last line: {"switch_seconds": S, "restart_seconds": R, "restart_over_switch": R/S, "failed_hot": 0, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from harnessrl.argtypes import at_least
from harnessrl.loop.registry import Registry

ADMIN = "promotion-bench-admin-key"


def start(registry: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "harnessrl", "serve", "--registry", str(registry), "--port", str(port),
         "--admin-key", ADMIN, "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def version(url: str) -> int | None:
    try:
        return httpx.get(url + "/health", timeout=1).json()["policy_version"]
    except httpx.HTTPError:
        return None


class Load:
    def __init__(self, url: str, threads: int):
        self.url, self.ok, self.failed, self.stop = url, 0, 0, threading.Event()
        self.workers = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]
        for w in self.workers:
            w.start()

    def run(self) -> None:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.is_set():
                try:
                    key = client.post("/v1/episodes", headers=admin, json={}).json()["api_key"]
                    r = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                    ok = r.status_code == 200
                except (httpx.HTTPError, KeyError, ValueError):
                    ok = False
                self.ok += ok
                self.failed += not ok
                if not ok:
                    time.sleep(0.01)

    def close(self) -> None:
        self.stop.set()
        for w in self.workers:
            w.join(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=at_least(1), default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        registry = Registry.create(Path(tmp) / "registry", "weather")
        for _ in range(3):
            registry.add_model("tiny-base")
        registry.promote("v1", reason="bench")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        server = start(registry.root, port)
        while version(url) != 1:
            time.sleep(0.1)
        load = Load(url, args.threads)
        time.sleep(3)  # steady state
        before = (load.ok, load.failed)
        t0 = time.perf_counter()
        registry.promote("v2", reason="bench")
        while version(url) != 2:
            time.sleep(0.005)
        switch = time.perf_counter() - t0
        time.sleep(2)
        hot = (load.ok - before[0], load.failed - before[1])
        # baseline: restart on the next version
        before = (load.ok, load.failed)
        registry.promote("v3", reason="bench")
        t0 = time.perf_counter()
        server.terminate()
        server.wait(30)
        server = start(registry.root, port)
        while version(url) != 3:
            time.sleep(0.02)
        restart = time.perf_counter() - t0
        time.sleep(2)
        cold = (load.ok - before[0], load.failed - before[1])
        load.close()
        server.terminate()
        server.wait(30)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; {args.threads} threads of load"
    )
    print(json.dumps({
        "switch_seconds": round(switch, 3),
        "restart_seconds": round(restart, 3),
        "restart_over_switch": round(restart / max(switch, 1e-3), 1),
        "failed_hot": hot[1],
        "requests_hot": hot[0],
        "failed_restart": cold[1],
        "requests_restart": cold[0],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
