"""The task generator: its completion mark (`stats.json` is written whole or not at all) and impossible tasks."""

import random
import subprocess
import sys

from harnessrl.envs.code.generate import LIBRARY, _functions, _save, mutations

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


def test_impossible_tasks_contradict_only_examples_that_are_literals(tmp_path):
    # add_months's examples expect `datetime.date(...)`, a call that no literal_eval reads: it cannot be the one
    kept = []
    for fn in (f for f in _functions(LIBRARY) if f.name in ("add_months", "days_in_month")):
        mutation = mutations(fn.source, fn.name)[0]
        kept.append((fn, (mutation,), mutation.apply(fn.source.encode()).decode(), "hard", 1, 3))
    tasks = _save(tmp_path, kept, LIBRARY, random.Random(0), impossible_share=1.0, test_share=0.2, candidates=2,
                  rejected={})  # fmt: skip
    assert {spec.source["function"]: spec.impossible for spec, _ in tasks} == {"add_months": False,
                                                                                "days_in_month": True}  # fmt: skip
    (folder,) = [folder for spec, folder in tasks if spec.impossible]
    assert "same(days_in_month(2023, 2), 29)" in (folder / "hidden" / "tests" / "test_dates_hidden.py").read_text()
