"""The production loop end to end at small size (examples/production/run_loop.py): real server, scripted
users with a hidden preference, two cycles, a broken and a hacking candidate through the same gate.

At this size RL's effect on the held-out preference is within noise (the full-size figures are in
the README); what must hold at any size: every episode counted, every decision recorded, the
broken candidate refused, the hacking candidate caught by the clarifying-question canary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "examples" / "production" / "run_loop.py"


def test_production_loop_end_to_end(tmp_path):
    # all 24 held-out cities: with 6, a current version that happened to make no valid call on them
    # could not be told from the broken one (CI, tiny-base v4: the broken candidate was promoted)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "run"), "--users", "32", "--cycles", "2",
         "--repeats", "1", "--items", "24"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["cycles"]) == 2
    for cycle in result["cycles"]:
        counts, users = cycle["counts"], cycle["users"]
        assert counts["episodes"] == 32 == sum(users.values())
        assert counts["expired"] == users.get("left", 0)  # sessions left open were expired by the server's TTL
        assert counts["labelled_used"] + counts["unlabelled"] + counts["stale"] == counts["finished"]
        assert cycle["decision"] in ("promoted", "refused") and cycle["eval_current"] is not None
    assert result["broken_refused"] and result["hacking_refused"]
    assert "canary clarifying_rate failed" in result["hacking_reasons"]
    assert result["hacking_clarifying_rate"]["candidate"] > result["hacking_clarifying_rate"]["current"]
    registry = tmp_path / "run" / "registry"
    events = [json.loads(line) for line in (registry / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("cycle") == 4  # two cycles and two gated candidates
    assert (registry / "report.html").is_file() and (registry / "report.png").is_file()
