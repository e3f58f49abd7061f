"""`harnessrl cycle`: SIGKILLed midway it leaves PROMOTED on a complete version, and the next cycle redoes the window."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from harnessrl.gateway import GatewayClient, create_app
from harnessrl.loop.registry import Registry
from harnessrl.loop.report import write_registry_report
from harnessrl.loop.store import Store

EXAMPLE = Path(__file__).parents[2] / "examples" / "production"
sys.path.insert(0, str(EXAMPLE))
import shop  # noqa: E402

ADMIN = "cycle-test-admin-key"


def _traffic(registry: Registry, users: int) -> None:
    store, policy = Store(registry.root / "traces.db"), registry.load(registry.promoted())

    async def run():
        gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN, recorder=store))
        rng = random.Random(0)
        said = [await shop.visit(gateway, rng.choice(shop.CITIES), rng, quiet=0.0, leave=0.0) for _ in range(users)]
        await gateway.aclose()
        return said

    asyncio.run(run())
    policy.close()
    store.close()


def _config(tmp_path: Path, registry: Registry) -> Path:
    items = [json.loads(line) for line in (EXAMPLE / "benchmark.jsonl").read_text().splitlines()[:3]]
    (tmp_path / "bench.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    config = {
        "registry": str(registry.root),
        "harness": f"{EXAMPLE / 'shop.py'}:harness",
        "benchmark": {"tasks": "bench.jsonl", "score": f"{EXAMPLE / 'shop.py'}:preference"},
        "gate": {"repeats": 1, "margin": 1.0},
        "batch_episodes": 5,
        "min_episodes": 4,
        "feedback_wait": 0,
    }
    (tmp_path / "loop.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "loop.yaml"


def test_a_cycle_killed_midway_leaves_a_servable_registry(tmp_path):
    registry = Registry.create(tmp_path / "registry", "weather")
    registry.add_model("tiny", 0)
    registry.promote("v1", reason="start")
    _traffic(registry, users=10)
    config = _config(tmp_path, registry)
    command = [sys.executable, "-m", "harnessrl", "cycle", str(config), "--once"]
    cycle = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while cycle.poll() is None and time.monotonic() < deadline:  # kill it while it writes the candidate
        if list(registry.root.glob(".staging-*")) or len(list((registry.root / "versions").iterdir())) > 1:
            break
        time.sleep(0.002)
    cycle.send_signal(signal.SIGKILL)
    cycle.wait()
    assert registry.promoted() == "weather@v1" and (registry.path("v1") / "version.json").is_file()
    assert not [e for e in registry.events() if e["event"] == "cycle"]  # the window was not consumed
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    event = json.loads(done.stdout.strip().splitlines()[-1])
    assert event["data_window"]["since"] == 0.0 and event["figures"]["counts"]["labelled_used"] == 10
    assert event["decision"]["promote"] and registry.promoted() == event["version"] != "weather@v1"
    assert not list(registry.root.glob(".staging-*"))
    assert registry.info(event["version"]).parent == "weather@v1"
    # the next cycle has no new traffic: skipped, the window stays open
    skipped = json.loads(subprocess.run(command, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    assert skipped["decision"]["skipped"] and skipped["version"] is None
    page = write_registry_report(registry.root)
    assert "promoted" in page.read_text() and page.with_suffix(".png").is_file()
