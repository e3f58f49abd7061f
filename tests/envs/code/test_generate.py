"""The task generator's completion mark: `stats.json` is written whole or not at all."""

import subprocess
import sys

WRITE_STOPS_MIDWAY = """import resource, signal, sys
from pathlib import Path
from harnessrl.envs.code.generate import generate

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))  # files stop at 64 bytes: a kill mid-write
generate(Path(sys.argv[1]), modules=["no such module"], progress=False)  # no task: stats.json alone
"""


def test_stats_json_cut_midway_leaves_no_completion_mark(tmp_path):
    done = subprocess.run([sys.executable, "-c", WRITE_STOPS_MIDWAY, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode != 0 and "File too large" in done.stderr, done.stderr
    assert not (tmp_path / "stats.json").exists()  # a truncated one would make the cached folder look generated
