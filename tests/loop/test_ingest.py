"""`harnessrl ingest`: every line validated, bad ones quarantined with line and reason, re-runs idempotent."""

from __future__ import annotations

import json

from tests.conftest import cli

GOOD = {
    "messages": [
        {"role": "system", "content": "You answer weather questions."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Oslo: sunny, 21 C"},
    ],
    "outcome": {"answer": "Oslo: sunny, 21 C", "success": True},
    "feedback": {"signal": "accepted"},
}


def _lines() -> list[bytes]:
    replay = {"messages": [{"role": "user", "content": "Weather in Lima?"}], "id": "prod-17"}
    return [
        json.dumps(GOOD).encode(),
        json.dumps(replay).encode(),
        b"",  # 3: empty
        b'{"messages": [{"role": "wizard", "content": "hi"}]}',  # 4: bad role
        json.dumps({"messages": [{"role": "system", "content": "x"}]}).encode(),  # 5: no user message
        b"[1, 2]",  # 6: not an object
        b"\xff\xfe not utf-8",  # 7
        json.dumps({**GOOD, "feedback": {"signal": "scalar"}}).encode(),  # 8: scalar without value
        json.dumps(GOOD).encode(),  # 9: a duplicate of line 1
        json.dumps({**GOOD, "extra": 1}).encode(),  # 10: unknown key
        json.dumps(GOOD)[:40].encode(),  # 11: truncated (a crashed writer)
        json.dumps(GOOD).replace("Oslo: sunny", "Oslo: \\ud800sunny", 1).encode(),  # 12: valid JSON, no text
        json.dumps({**GOOD, "outcome": {"info": {"latency": float("nan")}}}).encode(),  # 13: NaN (stored as null)
        json.dumps({**GOOD, "feedback": {"signal": "accepted", "call": -1}}).encode(),  # 14: a negative call
        json.dumps({**GOOD, "messages": [*GOOD["messages"], {"role": "user", "content": "thanks"}]}).encode(),  # 15
    ]


def _ingest(tmp_path, *extra: str) -> dict:
    done = cli("ingest", tmp_path / "traces.jsonl", "--store", tmp_path / "t.db", *extra)
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ingest_counts_quarantines_and_is_idempotent(tmp_path):
    (tmp_path / "traces.jsonl").write_bytes(b"\n".join(_lines()))
    first = _ingest(tmp_path, "--tasks", str(tmp_path / "tasks.jsonl"), "--sft", str(tmp_path / "sft.jsonl"))
    assert first == {"lines": 15, "imported": 4, "quarantined": 11, "duplicates": 1}
    bad = [json.loads(line) for line in (tmp_path / "traces.jsonl.quarantine.jsonl").read_text().splitlines()]
    reasons = {b["line"]: b["reason"] for b in bad}
    assert sorted(reasons) == [3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14]
    assert reasons[3] == "empty line" and reasons[4].startswith("messages.0.role")
    assert "no user message" in reasons[5] and "not UTF-8" in reasons[7]
    assert reasons[8] == "feedback.value: given with signal 'scalar' and only with it"  # the feedback's, named so
    assert reasons[14] == "feedback.call: an index is 0 or more"
    assert "extra" in reasons[10] and reasons[11].startswith("not JSON")
    assert reasons[12].startswith("messages.2.content: not valid Unicode text: a lone surrogate")
    assert reasons[13] == "outcome.info.latency: nan is not a JSON number"
    tasks = [json.loads(line) for line in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    assert [t["prompt"] for t in tasks] == ["Weather in Oslo?", "Weather in Lima?", "Weather in Oslo?"]
    assert tasks[0]["data"]["reply"]["content"] == "Oslo: sunny, 21 C" and tasks[1]["data"]["trace_id"] == "prod-17"
    assert tasks[2]["data"] == tasks[0]["data"]  # a user's "thanks" after the last reply: the same task and reply
    (demo,) = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert demo["reply"]["role"] == "assistant" and demo["messages"][-1]["role"] == "user"
    again = _ingest(tmp_path)
    assert again == {"lines": 15, "imported": 4, "quarantined": 11, "duplicates": 4}
    assert len((tmp_path / "traces.jsonl.quarantine.jsonl").read_text().splitlines()) == 11  # rewritten, not appended
