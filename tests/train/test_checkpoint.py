"""Checkpoints survive a process killed at the worst moment."""

import subprocess
import sys
import textwrap

from harnessrl.train.checkpoint import latest_checkpoint, load_state, save_checkpoint

KILLED_WHILE_REPLACING = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from harnessrl.train.checkpoint import save_checkpoint

    root = Path(sys.argv[1])
    write = lambda folder: (folder / "model.safetensors").write_text("weights")
    save_checkpoint(root, 1, write, {"updates": 1})
    save_checkpoint(root, 2, write, {"updates": 2})
    real_replace = os.replace

    def replace(src, dst):  # die after the old step-000002 is out of the way, before the new one is in
        if str(src).endswith(".tmp") and Path(dst).name == "step-000002":
            os._exit(9)
        return real_replace(src, dst)

    os.replace = replace
    save_checkpoint(root, 2, write, {"updates": 2, "again": True})  # a resumed run saves the same number again
""")


def test_a_kill_between_moving_the_old_folder_and_renaming_the_new_one_leaves_a_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    run = subprocess.run([sys.executable, "-c", KILLED_WHILE_REPLACING, str(root)], capture_output=True, text=True)
    assert run.returncode == 9, run.stderr
    assert (root / "latest").read_text() == "step-000002" and not (root / "step-000002").exists()
    # `latest` names a folder that is not there: the newest complete one instead, the step-2 moved aside (it fell
    # back to step 1 and, with no step 1 kept, to none: the run started over)
    found = latest_checkpoint(root)
    assert found == root / ".step-000002.old" and load_state(found) == {"updates": 2}
    save_checkpoint(root, 2, lambda folder: (folder / "model.safetensors").write_text("w"), {"updates": 2})
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001", "step-000002"]


def test_latest_names_the_newest_and_old_ones_are_pruned(tmp_path):
    write = lambda folder: (folder / "model.safetensors").write_text("weights")  # noqa: E731
    from harnessrl.train.checkpoint import save_checkpoint

    for number in range(1, 6):
        save_checkpoint(tmp_path, number, write, {"updates": number}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000004", "step-000005"]
    assert load_state(latest_checkpoint(tmp_path)) == {"updates": 5}


def test_checkpoints_past_six_digits_are_ordered_by_number_not_by_text(tmp_path):
    write = lambda folder: (folder / "model.safetensors").write_text("weights")  # noqa: E731
    from harnessrl.train.checkpoint import save_checkpoint

    for number in (999_998, 999_999, 1_000_000):
        save_checkpoint(tmp_path, number, write, {"updates": number}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-1000000", "step-999999"]  # 999998 pruned
    (tmp_path / "latest").unlink()  # without the pointer: the newest by number
    assert load_state(latest_checkpoint(tmp_path)) == {"updates": 1_000_000}
