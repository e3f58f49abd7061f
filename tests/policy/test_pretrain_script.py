"""scripts/pretrain_tiny_base.py at toy size: resumable, a second stage from given weights, bad flags named."""

import json
import subprocess
import sys
from pathlib import Path

from harnessrl.policy.mixture import SKILLS

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_tiny_base.py"
TOY = ["--rows", "2", "--width", "64", "--hidden", "32", "--layers", "1", "--warmup", "1", "--probe-items", "1"]


def pretrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *TOY, *args], capture_output=True, text=True, timeout=600)


def steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()]


def test_a_stopped_run_resumes_without_gap_and_a_second_stage_starts_from_its_weights(tmp_path):
    stage1, stage2 = tmp_path / "stage1", tmp_path / "stage2"
    first = pretrain("--out", str(stage1), "--steps", "3", "--export-dir", str(tmp_path / "export1"))
    assert first.returncode == 0, first.stderr[-2000:]
    more = pretrain("--out", str(stage1), "--steps", "5", "--resume", "--export-dir", str(tmp_path / "export1"))
    assert more.returncode == 0, more.stderr[-2000:]
    assert steps(stage1) == [1, 2, 3, 4, 5]
    exported = tmp_path / "export1"
    assert (exported / "model.safetensors").is_file()
    assert set(json.loads((exported / "probe.json").read_text())["final"]) == set(SKILLS)
    init = ["--init", str(exported), "--weights", "record_field=0.6,entity_call=0.3", "--records-ramp", "2"]
    second = pretrain("--out", str(stage2), "--steps", "3", "--seed", "1", *init, "--export-dir", str(tmp_path / "e2"))
    assert second.returncode == 0, second.stderr[-2000:]
    assert "--init" in (tmp_path / "e2" / "README.md").read_text()
    changed = pretrain("--out", str(stage2), "--steps", "4", "--seed", "1", "--resume", "--init", str(exported),
                       "--export-dir", str(tmp_path / "e2"))  # fmt: skip
    assert changed.returncode != 0 and "--weights" in changed.stderr + changed.stdout


def test_an_unknown_skill_in_weights_is_named(tmp_path):
    done = pretrain("--out", str(tmp_path / "run"), "--steps", "1", "--weights", "reasoning=1")
    assert done.returncode != 0 and "reasoning" in done.stderr
