"""`harnessrl train` end to end at minimal size."""

import json
import subprocess
import sys

MINIMAL = """
model: tiny
eval_tasks: 2
agent: {max_turns: 2, max_tokens: 16}
sft: {steps: 1, batch_episodes: 4}
rl:
  updates: 1
  rollout: {group_size: 2, groups_per_update: 1, staleness: 0}
"""


def test_train_runs_end_to_end_and_writes_the_run_folder(tmp_path):
    (tmp_path / "job.yaml").write_text(MINIMAL)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "harnessrl", "train", str(tmp_path / "job.yaml"), "--out", str(out)],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for key in ("heldout_success_before", "heldout_success_after", "heldout_success_greedy_before", "heldout_success_greedy_after", "wall_seconds"):
        assert key in summary
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("loss/sft" in s for s in steps) and any("rollout/groups" in s for s in steps)  # an RL update (skipped when the group tied)
    for name in ("config.yaml", "demos.jsonl", "eval_before.jsonl", "eval_after.jsonl", "heldout.png", "rewards.png"):
        assert (out / name).is_file(), name
    assert (out / "checkpoints" / "latest").is_file()


def test_a_bad_config_key_fails_at_load_naming_it(tmp_path):
    (tmp_path / "job.yaml").write_text("rl:\n  updatez: 3\n")
    done = subprocess.run([sys.executable, "-m", "harnessrl", "train", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "updatez" in done.stderr
