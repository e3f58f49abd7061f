"""The coding agent through the real gateway: its tools, the scripted expert's fix scored by the hidden
tests, and self-summarisation recorded as one more call of the main conversation."""

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.envs.code.expert import CodeExpert, fix_edits
from harnessrl.envs.code.harness import CodingAgent, _Run
from harnessrl.envs.code.reward import cheat_rate, code_reward
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.train.sequences import episode_sequences
from harnessrl.types import Episode, Task
from tests.envs.code.test_score import FIXED, PLUGIN_THROUGH_GC, task  # noqa: F401  (the calc task fixture)


def with_reference(task) -> Task:  # noqa: F811
    spec, folder = task
    (folder / "reference").mkdir()
    (folder / "reference" / "calc.py").write_text(FIXED)
    return spec.task(folder)


def test_tools_answer_bad_calls_with_reasons(task, tmp_path):  # noqa: F811
    run = _Run(CodingAgent(), task[0].task(task[1]), tmp_path / "ws")
    assert run.list_files().splitlines() == ["calc.py", "tests/test_calc.py"]
    assert run.read_file("calc.py", 3, 3) == "3:     return a - b"
    assert "was not found" in run.edit_file("calc.py", "return a * b", "x")
    assert "occurs 2 times" in run.edit_file("calc.py", ": int", "c")
    assert "is unchanged" in run.edit_file("calc.py", "a - b", "a - b") and run.edited == []  # SmolLM2 did this
    assert run.edit_file("calc.py", "a - b", "a + b") == "edited calc.py" and run.edited == ["calc.py"]
    assert run.search_code(r"a \+ b") == "calc.py:3: return a + b"
    assert "exit code 0" in run.run_tests() and "1 passed" in run.run_tests()
    os.symlink("/proc/self/environ", run.workspace / "leak.py")  # what the agent's code could plant
    os.mkfifo(run.workspace / "pipe.py")
    assert run.search_code("PATH") == "no matches" and run.list_files().splitlines() == [
        "calc.py",
        "tests/test_calc.py",
    ]
    edit = '{"path": "pipe.py", "search": "", "replace": "x"}'
    assert "pipe.py is not a regular file" in asyncio.run(run.tools.call("edit_file", edit))[0]
    (run.workspace / "big.py").write_text("PATH = 1\n" * 40000)  # 360,000 bytes: read whole, it costs memory
    assert run.search_code("PATH") == "no matches"
    read = asyncio.run(run.tools.call("read_file", '{"path": "big.py"}'))[0]
    assert "big.py: 360000 bytes, over the 262144 a file may have" in read
    for bad in ("../../etc/passwd", "/etc/passwd"):
        try:
            run._path(bad)
        except ValueError as exc:
            assert "outside the project" in str(exc)
        else:
            raise AssertionError(bad)


async def test_expert_fix_is_scored_by_the_hidden_tests(gateway, task):  # noqa: F811
    reward = code_reward()
    engine = RolloutEngine(gateway, CodeExpert(CodingAgent(), p_explore=1.0), reward, RolloutConfig(group_size=2))
    episode = await engine.episode(with_reference(task))
    assert episode.status == "finished", episode.failure_reason
    info = episode.outcome.info
    assert episode.outcome.success and info["hidden"]["passed"] == info["hidden"]["total"] == 3
    assert info["submitted"] and info["edited_files"] == ["calc.py"] and info["lines_changed"] == 2
    assert all(c.demonstration for c in episode.calls)
    (scored,) = await reward.score_group([episode])
    assert scored.terms["hidden_tests"] == 1.0 and not scored.flags
    assert cheat_rate([episode]) == 0.0


async def test_summary_goes_through_the_gateway_and_splits_the_chain(gateway, task):  # noqa: F811
    agent = CodingAgent(max_turns=3, max_tokens=24, summarise_at=64, summary_tokens=16)
    engine = RolloutEngine(gateway, agent, code_reward(), RolloutConfig(group_size=2))
    episode = await engine.episode(task[0].task(task[1]))
    assert episode.status == "finished", episode.failure_reason
    summaries = [c for c in episode.calls if c.agent == "summariser"]
    assert summaries and episode.outcome.info["summaries"] == len(summaries)
    assert all(c.lineage == "main" and c.trainable and c.completion_ids for c in summaries)
    segments = episode_sequences(episode, 1.0, share=True)
    assert len(segments) >= 2 and abs(sum(s.weight for s in segments) - 1.0) < 1e-9
    masked = episode_sequences(episode, 1.0, mask_agents=["summariser"])
    assert sum(s.loss_tokens for s in masked) == sum(s.loss_tokens for s in segments) - sum(
        len(c.completion_ids) for c in summaries
    )


def test_fix_edits_widen_until_the_search_text_is_unique():
    broken, fixed = "a\nx\nb\nx\nc\n", "a\nx\nb\ny\nc\n"
    assert fix_edits(broken, fixed) == [(3, "b\nx\nc\n", "b\ny\nc\n")]


@pytest.mark.parametrize(
    ("broken", "fixed"),
    [
        ("x = 1\ny = 2\nx = 1\ny = 2\n", "x = 1\ny = 3\nx = 1\ny = 2\n"),  # a block repeated whole
        ("a\nb\na\nb\n", "a\nB\na\nb\n"),  # two edits whose widened blocks overlap
        ("c\nc\nc\n", "c\nC\nC\n"),  # an anchor found twice only when overlapping
        ("b\na\na\na\nb\na\na\n", "b\na\nA\na\nb\nA\na\n"),
    ],
)
def test_the_experts_edits_apply_through_edit_file_on_files_with_repeated_lines(broken, fixed, task, tmp_path):  # noqa: F811
    run = _Run(CodingAgent(), task[0].task(task[1]), tmp_path / "ws")
    (run.workspace / "consts.py").write_text(broken)
    for _, search, replace in fix_edits(broken, fixed):
        assert run.edit_file("consts.py", search, replace) == "edited consts.py"
    assert (run.workspace / "consts.py").read_text() == fixed


def test_a_tampering_agent_is_flagged(task, tmp_path):  # noqa: F811
    # an agent that "fixes" the visible test instead of the code: the edit is dropped and flagged
    run = _Run(CodingAgent(), task[0].task(task[1]), tmp_path / "ws")
    run.edit_file("tests/test_calc.py", "assert add(2, 2) == 4", "assert True")
    run.submitted = True
    outcome = run.outcome()
    assert outcome.info["dropped"] == {"tests/test_calc.py": "modified test path"} and not outcome.success
    (scored,) = asyncio.run(code_reward().score_group([Episode(task=run.task, outcome=outcome)]))
    assert "test_tampering" in scored.flags and scored.terms["hidden_tests"] == 0.0
    shutil.rmtree(tmp_path / "ws")
    assert Path(task[1] / "repo" / "tests" / "test_calc.py").read_text().count("add(2, 2) == 4") == 1


def test_a_plugin_registered_from_the_tested_code_scores_nothing_and_is_flagged(task, tmp_path):  # noqa: F811
    # calc.py finds pytest's plugin manager through gc and registers a pytest_pyfunc_call that passes every test
    run = _Run(CodingAgent(), task[0].task(task[1]), tmp_path / "ws")
    assert run.edit_file("calc.py", "def add", PLUGIN_THROUGH_GC + "\n\ndef add") == "edited calc.py"
    outcome = run.outcome()
    assert outcome.info["hidden"]["passed"] == 0 and outcome.info["hidden"]["invalid"] and not outcome.success
    (scored,) = asyncio.run(code_reward().score_group([Episode(task=run.task, outcome=outcome)]))
    assert {"test_tampering", "report_invalid"} <= set(scored.flags) and scored.total < 0


def test_names_that_are_not_utf8_and_a_workspace_behind_a_link_break_nothing(task, tmp_path):  # noqa: F811
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")  # TMPDIR behind a symlink
    run = _Run(CodingAgent(), task[0].task(task[1]), tmp_path / "link" / "ws")
    assert run.edit_file("calc.py", "a - b", "a + b") == "edited calc.py" and run.edited == ["calc.py"]
    with open(os.fsencode(tmp_path / "link" / "ws") + b"/\xff.py", "w") as f:  # the agent's code: open(b'\xff.py', 'w')
        f.write("X = 1\n")
    assert "\udcff" not in run.list_files()
    with pytest.raises(ValueError, match="is not UTF-8 text"):  # JSON's "\udcff" from the model: no such file made
        run.edit_file("\udcff.py", "", "X = 1\n")
    outcome = run.outcome()
    assert outcome.info["dropped"] == {"\ufffd.py": "not UTF-8"} and outcome.success
    Episode(task=run.task, outcome=outcome).model_dump_json()  # the checkpoint's write: no lone surrogate


def test_a_backtracking_search_stops_with_a_tool_error(task, tmp_path):  # noqa: F811
    # `(a+)+b` on a line of 5,000 a's backtracks for hours: run in its own process, so a hang fails the test
    (task[1] / "repo" / "slow.py").write_text("x = '" + "a" * 5000 + "'\n")
    script = (
        "import sys; from pathlib import Path; from harnessrl.envs.code.harness import CodingAgent, _Run;"
        "from harnessrl.envs.code.tasks import load_task; folder = Path(sys.argv[1]);"
        "run = _Run(CodingAgent(), load_task(folder).task(folder), Path(sys.argv[2]));"
        "print(run.search_code('(a+)+b')); print(run.search_code('x = '))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(task[1]), str(tmp_path / "ws")], capture_output=True, text=True, timeout=60
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "error: the pattern took over 2 s (nested repeats backtrack); simplify it", done.stderr
    assert lines[1].startswith("slow.py:1: x = 'aaa") and len(lines[1]) < 250  # an ordinary search still answers


def test_list_files_and_read_file_outputs_are_capped_and_say_so(task, tmp_path):  # noqa: F811
    for i in range(250):
        (task[1] / "repo" / "data" / f"{i:03}.txt").parent.mkdir(exist_ok=True)
        (task[1] / "repo" / "data" / f"{i:03}.txt").write_text("")
    (task[1] / "repo" / "wide.py").write_text("x = 1\n" + "y = '" + "z" * 200_000 + "'\n")
    run = _Run(CodingAgent(), task[0].task(task[1]), tmp_path / "ws")
    listed = run.list_files().splitlines()
    assert len(listed) == 201 and listed[-1] == "... and 53 more files (the first 200 are listed)"
    read = run.read_file("wide.py")
    assert read.startswith("1: x = 1\n2: y = 'zzz") and read.endswith(" [... 199806 more characters]")
    assert len(read) < 300


def test_only_an_empty_diff_is_an_abstention(task, tmp_path):  # noqa: F811
    # an honest fix whose code reads like an abstention to a text detector ("unable to find", "not sure", "?")
    honest = _Run(CodingAgent(), task[0].task(task[1]), tmp_path / "honest")
    fix = 'if a is None:  # not sure callers pass None\n        raise KeyError(f"unable to find {a}")\n    return a + b  # not a - b?'
    assert honest.edit_file("calc.py", "return a - b", fix) == "edited calc.py"
    idle = _Run(CodingAgent(), task[0].task(task[1]), tmp_path / "idle")  # changes nothing
    episodes = [Episode(task=run.task, outcome=run.outcome()) for run in (honest, idle)]
    assert episodes[0].outcome.answer.rstrip().endswith("?") and episodes[0].outcome.success
    fixed, empty = asyncio.run(code_reward().score_group(episodes))
    assert fixed.flags == [] and fixed.total == 1.0
    assert empty.flags == ["abstention"] and empty.terms["abstention"] == -0.2 and empty.total == -0.2


def test_an_edit_keeps_a_crlf_files_line_endings(task, tmp_path):  # noqa: F811
    spec, folder = task
    (folder / "repo" / "calc.py").write_bytes(b"X = 1\r\nY = 2\r\nZ = 3\r\n")
    run = _Run(CodingAgent(), spec.task(folder), tmp_path / "ws")
    assert run.edit_file("calc.py", "Y = 2\nZ = 3", "Y = 5\nZ = 3") == "edited calc.py"  # as read_file shows it
    assert (run.workspace / "calc.py").read_bytes() == b"X = 1\r\nY = 5\r\nZ = 3\r\n"
    assert run.outcome().info["lines_changed"] == 2  # one line out, one in: not every line of the file


def test_a_lone_surrogate_in_an_edit_is_refused_and_the_file_kept(task, tmp_path):  # noqa: F811
    run = _Run(CodingAgent(), task[0].task(task[1]), tmp_path / "ws")
    before = (run.workspace / "calc.py").read_bytes()
    edit = '{"path": "calc.py", "search": "a - b", "replace": "a + b  # \\ud800"}'  # valid JSON, no UTF-8 text
    result, ok = asyncio.run(run.tools.call("edit_file", edit))
    assert not ok and result == (  # refused by the toolbox, naming the argument, before edit_file runs
        "error: replace holds '\\ud800' at character 9, a lone surrogate no UTF-8 text can carry"
    )
    assert (run.workspace / "calc.py").read_bytes() == before and run.edited == []
    created = '{"path": "new.py", "search": "", "replace": "\\udcff"}'
    assert "replace holds" in asyncio.run(run.tools.call("edit_file", created))[0]
    assert not (run.workspace / "new.py").exists()


def test_an_anchor_that_occurs_twice_overlapping_is_ambiguous(task, tmp_path):  # noqa: F811
    run = _Run(CodingAgent(), task[0].task(task[1]), tmp_path / "ws")
    (run.workspace / "cfg.py").write_text("retries = 0\nretries = 0\nretries = 0\n")
    # "retries = 0\nretries = 0\n" is lines 1-2 and lines 2-3: str.count sees one
    answer = run.edit_file("cfg.py", "retries = 0\nretries = 0\n", "retries = 0\nretries = 5\n")
    assert answer.startswith("error: the search text occurs 2 times in cfg.py")
    assert (run.workspace / "cfg.py").read_text() == "retries = 0\nretries = 0\nretries = 0\n"


def test_a_file_that_is_not_utf8_is_named_by_read_and_edit(task, tmp_path):  # noqa: F811
    spec, folder = task
    (folder / "repo" / "legacy.py").write_bytes(b"# -*- coding: latin-1 -*-\nNAME = 'caf\xe9'\n")
    run = _Run(CodingAgent(), spec.task(folder), tmp_path / "ws")
    why = "legacy.py is not UTF-8 text (byte 0xe9 at offset 37): read_file and edit_file open UTF-8 files only"
    for name, arguments in (("read_file", '{"path": "legacy.py"}'),
                            ("edit_file", '{"path": "legacy.py", "search": "NAME", "replace": "TITLE"}')):  # fmt: skip
        assert asyncio.run(run.tools.call(name, arguments)) == (f"error: {name} raised ValueError: {why}", False)
