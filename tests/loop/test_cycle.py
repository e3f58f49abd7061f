"""`harnessrl cycle`: SIGKILLed midway it leaves PROMOTED on a complete version, and the next cycle redoes the window."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harnessrl.gateway import GatewayClient, create_app
from harnessrl.loop.cycle import complete_interrupted, window_start
from harnessrl.loop.registry import Registry, VersionInfo
from harnessrl.loop.report import write_registry_report
from harnessrl.loop.store import Store
from tests.conftest import cli

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
    renamed = (registry.root / "versions" / "weather@v2").is_dir()  # killed after the rename, not in staging
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    event = json.loads(done.stdout.strip().splitlines()[-1])
    # redone, or (killed after the rename) completed from version.json and this cycle skipped
    first = next(e for e in registry.events() if e["event"] == "cycle")
    assert first.get("recovered", False) == renamed and event["version"] == (None if renamed else first["version"])
    assert first["data_window"]["since"] == 0.0 and first["figures"]["counts"]["labelled_used"] == 10
    assert first["decision"]["promote"] and registry.promoted() == first["version"] != "weather@v1"
    assert not list(registry.root.glob(".staging-*"))
    assert registry.info(first["version"]).parent == "weather@v1"
    # the next cycle has no new traffic: skipped, the window stays open
    skipped = json.loads(subprocess.run(command, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    assert skipped["decision"]["skipped"] and skipped["version"] is None and skipped["completed"] == []
    page = write_registry_report(registry.root)
    assert "promoted" in page.read_text() and page.with_suffix(".png").is_file()


def test_what_a_cycle_killed_after_its_rename_left_undone_is_completed(tmp_path):
    registry = Registry.create(tmp_path / "registry", "weather")
    registry.add_model("tiny", 0)
    registry.promote("v1", reason="start")

    def written(number: int, parent: str, promote: bool, until: float) -> str:  # a cycle's version, renamed in
        info = VersionInfo(
            id=f"weather@v{number}", number=number, parent=parent, data_window={"since": 0.0, "until": until},
            decision={"promote": promote, "reasons": []},
        )  # fmt: skip
        copy = shutil.ignore_patterns("version.json")
        registry.add(lambda folder: shutil.copytree(registry.path("v1"), folder, dirs_exist_ok=True, ignore=copy), info)
        return info.id

    v2 = written(2, "weather@v1", promote=True, until=100.0)  # killed before its cycle line
    assert complete_interrupted(registry) == [f"logged the cycle of {v2}", f"promoted {v2}"]
    assert registry.promoted() == v2 and window_start(registry) == 100.0 and complete_interrupted(registry) == []
    v3 = written(3, v2, promote=True, until=200.0)
    registry.log("cycle", version=v3, parent=v2, data_window={"since": 100.0, "until": 200.0},
                 decision={"promote": True, "reasons": []})  # fmt: skip  # killed between its line and PROMOTED
    assert complete_interrupted(registry) == [f"promoted {v3}"] and registry.promoted() == v3
    v4 = written(4, v3, promote=False, until=300.0)  # its gate failed: its line written, nothing promoted
    assert complete_interrupted(registry) == [f"logged the cycle of {v4}"] and registry.promoted() == v3
    v5 = written(5, v3, promote=True, until=400.0)
    registry.promote("v1", reason="by hand")  # PROMOTED moved on meanwhile: the hand's choice stands
    assert complete_interrupted(registry) == [f"logged the cycle of {v5}"] and registry.promoted() == "weather@v1"
    assert window_start(registry) == 400.0
    registry.rollback()  # back to v3, v5's parent: v5's promotion was refused when its line was written
    assert registry.promoted() == v3 and complete_interrupted(registry) == [] and registry.promoted() == v3
    (v5_line,) = [e for e in registry.events() if e.get("version") == v5 and e["event"] == "cycle"]
    assert not v5_line["decision"]["promote"] and "PROMOTED moved" in v5_line["decision"]["reasons"][-1]


def test_cycle_refuses_bad_configs_now_and_every_survives_a_failed_cycle(tmp_path):
    registry = Registry.create(tmp_path / "registry", "weather")  # nothing promoted: every cycle fails
    config = _config(tmp_path, registry)
    good = yaml.safe_load(config.read_text())
    twice = tmp_path / "twice.jsonl"  # one item listed twice would weigh double in the gate's pairing
    lines = (tmp_path / good["benchmark"]["tasks"]).read_text().splitlines()
    twice.write_text("\n".join([*lines, lines[0]]) + "\n")
    for field, value, said in [
        ("benchmark", {**good["benchmark"], "tasks": "nope.jsonl"}, "benchmark.tasks: [Errno 2]"),
        ("harness", f"{EXAMPLE / 'shop.py'}:no_such", "harness: "),
        ("benchmark", {**good["benchmark"], "score": "no_such_module:f"}, "benchmark.score: 'no_such_module:f'"),
        ("benchmark", {**good["benchmark"], "tasks": str(twice)}, "task ids used twice: ['"),
        ("registry", str(tmp_path / "nope"), "registry: "),  # at load: under --every it would fail every period
        ("registry", str(tmp_path / "damaged"), "damaged/registry.json: expected"),
    ]:
        (tmp_path / "damaged").mkdir(exist_ok=True)
        (tmp_path / "damaged" / "registry.json").write_text('{"name": ')  # a truncated write
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**good, field: value}))
        bad = cli("cycle", tmp_path / "bad.yaml", "--once")
        assert bad.exit_code == 2 and said in bad.output and "bad.yaml" in bad.output, bad.output
    refused = cli("cycle", config, "--every", "1h", "--candidate", tmp_path)
    assert refused.exit_code == 2 and "--candidate gates one folder once" in refused.output
    back_to_back = cli("cycle", config, "--every", "0s")
    assert back_to_back.exit_code == 2 and "'0s': a period longer than 0" in back_to_back.output
    looping = subprocess.Popen(
        [sys.executable, "-m", "harnessrl", "cycle", str(config), "--every", "1s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while sum(e["event"] == "cycle_failed" for e in registry.events()) < 2 and time.monotonic() < deadline:
            assert looping.poll() is None, "the loop stopped at a failed cycle"
            time.sleep(0.2)
    finally:
        looping.kill()
        looping.wait()
    failed = [e for e in registry.events() if e["event"] == "cycle_failed"]
    assert len(failed) >= 2 and "nothing promoted yet" in failed[0]["error"]


def test_a_file_harness_with_dataclasses_loads_once_and_shares_its_module_with_its_score(tmp_path):
    """FILE.py:NAME runs the file as a module registered in sys.modules (a dataclass under `from __future__ import
    annotations` looks its module up there), once per version of the file: harness and score share its state."""
    from harnessrl.loop.cycle import BenchmarkConfig, LoopConfig

    (tmp_path / "h.py").write_text(
        "from __future__ import annotations\nfrom dataclasses import dataclass\n\n@dataclass\nclass Seen:\n"
        "    n: int = 0\n\nSEEN = Seen()\n\nasync def harness(task, llm):\n    SEEN.n += 1\n\n"
        "def score(episode):\n    return SEEN.n\n"
    )
    config = LoopConfig(
        registry=tmp_path, harness="h.py:harness", benchmark=BenchmarkConfig(tasks=tmp_path, score="h.py:score")
    )
    config._base = tmp_path
    harness, score = config.imported("h.py:harness"), config.imported("h.py:score")
    assert harness.__globals__ is score.__globals__ and config.imported("h.py:harness") is harness
    (tmp_path / "h.py").write_text("def score(episode):\n    return 2\n")  # edited: run again at the next cycle
    os.utime(tmp_path / "h.py", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert config.imported("h.py:score")(None) == 2


def test_a_candidate_folder_that_does_not_load_is_named_as_the_candidate(tmp_path):
    """The loader's error named a --model flag that `cycle` does not have."""
    from harnessrl.loop.cycle import _external

    registry = Registry.create(tmp_path / "registry", "weather")
    with pytest.raises(ValueError, match=f"^--candidate {tmp_path / 'nope'}: not one of"):
        _external(registry, tmp_path / "nope")
