"""The coding job end to end at minimal size: tasks generated from one library module (validated in the
sandbox), expert demonstrations, SFT, eval, one RL update with the code metrics, eval, summary."""

import json

import pytest

from harnessrl.envs.code.generate import generate
from harnessrl.envs.code.tasks import CodeTask
from harnessrl.job import code
from harnessrl.job.config import JobConfig
from harnessrl.types import Episode, Outcome, Task, read_jsonl


def test_code_job_runs_end_to_end(tmp_path):
    tasks = generate(
        tmp_path / "tasks", per_function=1, pairs=0, modules=["text"], impossible_share=0.2, progress=False
    )
    stats = json.loads((tmp_path / "tasks" / "stats.json").read_text())
    assert stats["tasks"] == len(tasks) >= 3 and stats["impossible"] >= 1
    assert stats["split"].get("test") and stats["split"].get("train")
    for spec, folder in tasks:  # each kept task: its hidden tests fail before the fix (validated by the generator)
        assert spec.target_tests and (folder / "reference").is_dir() and not (folder / "repo" / "reference").exists()
    config = JobConfig.model_validate({
        "code": {"tasks": str(tmp_path / "tasks"), "max_turns": 3, "max_tokens": 48, "test_seconds": 15},
        "sft": {"steps": 2, "batch_episodes": 4}, "eval_tasks": 2, "eval_repeats": 1,
        "rl": {"updates": 1, "validation_tasks": 0, "rollout": {"group_size": 2, "groups_per_update": 1},
               "train": {"segments": "share"}},
    })  # fmt: skip
    summary = code.run(config, tmp_path / "run", progress=False)
    assert summary["heldout_tasks"] == 2 and summary["tasks"]["tasks"] == len(tasks)
    assert 0 <= summary["heldout_hidden_tests_after"] <= 1 and summary["cheat_rate_after"] == 0.0
    low, high = summary["heldout_gain_ci"]  # 2 tasks, 1 episode each: the bootstrap spans their two gains
    gains = [
        after - before
        for before, after in zip(*(_solved(tmp_path / "run" / f"eval_{w}.jsonl") for w in ("before", "after")))
    ]
    assert [low, high] == [min(gains), max(gains)]
    assert summary["heldout_alarms"] == []  # 2 tasks of 1 episode: no fall can be told from noise
    demos = [json.loads(line) for line in (tmp_path / "run" / "demos.jsonl").read_text().splitlines()]
    assert demos and all(d["outcome"]["success"] for d in demos)  # the expert's fixes pass the hidden tests
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"code/hidden_tests", "code/cheat_rate", "code/submitted", "reward/hidden_tests"} <= set(metrics[-1])
    assert (tmp_path / "run" / "summary.json").is_file() and (tmp_path / "run" / "rewards.png").is_file()


def _solved(path) -> list[float]:
    episodes = sorted(read_jsonl(path, Episode), key=lambda e: e.task.id)
    return [float(bool(e.outcome and e.outcome.success)) for e in episodes]


def test_heldout_alarms_name_falling_solves_and_tests_and_rising_cheats_beyond_noise():
    """8 possible tasks solved before, 7 lost after (1 of 4 hidden tests left), and 7 impossible tasks
    cheated after (all hidden tests passed): every alarm fires; the same episodes raise none."""

    def episode(task: int, impossible: bool, passed: int) -> Episode:
        hidden = {"passed": passed, "total": 4}
        outcome = Outcome(success=passed == 4, info={"hidden": hidden})
        data = {"impossible": impossible}
        return Episode(task=Task(id=f"t{task}", prompt="fix", data=data), outcome=outcome, status="finished")

    before = [episode(t, False, 4) for t in range(8)] + [episode(t, True, 0) for t in range(8, 15)]
    after = [episode(t, False, 4 if t == 0 else 1) for t in range(8)] + [episode(t, True, 4) for t in range(8, 15)]
    alarms = ["sampled_falling", "hidden_tests_falling", "cheat_rising"]
    assert code.heldout_alarms({"before": before, "after": after}) == alarms  # the cheats hide no fall
    honest = {"before": before, "after": after[:8] + before[8:]}
    assert code.heldout_alarms(honest) == alarms[:2]
    assert code.heldout_alarms({"before": before, "after": before}) == []


def test_the_job_refuses_to_train_where_the_sandbox_cannot_hide_the_hidden_tests(tmp_path, monkeypatch):
    from harnessrl.envs.code import sandbox

    monkeypatch.setattr(sandbox, "_bwrap_works", lambda: False)  # a machine without bubblewrap
    config = JobConfig.model_validate({"code": {"tasks": str(tmp_path / "tasks")}})
    with pytest.raises(ValueError, match=r"guard is off on this machine .* code.unsandboxed: true"):
        code.run(config, tmp_path / "run", progress=False)


def test_the_heldout_sample_spreads_across_functions_and_keeps_impossible_tasks(tmp_path):
    # 10 test-split functions of 4 tasks each, in folder-name order; 2 of the 40 tasks impossible (5 %)
    loaded = [
        (CodeTask(id=f"m.f{f}.{k}", issue="i", split="test", impossible=(f, k) in ((3, 0), (8, 1)),
                  source={"module": "m", "function": f"f{f}"}), tmp_path / f"m.f{f}.{k}")
        for f in range(10) for k in range(4)
    ]  # fmt: skip
    picked = code.heldout_sample(loaded + [(CodeTask(id="t", issue="i", split="train"), tmp_path)], 12, seed=0)
    functions = [spec.source["function"] for spec, _ in picked]
    assert len(picked) == 12 and len(set(functions)) == 10  # every function before any twice
    assert sum(spec.impossible for spec, _ in picked) == 1 and all(spec.split == "test" for spec, _ in picked)
    assert picked == code.heldout_sample(loaded, 12, seed=0) and picked != code.heldout_sample(loaded, 12, seed=1)
    assert sorted(s.id for s, _ in code.heldout_sample(loaded, None, seed=0)) == sorted(s.id for s, _ in loaded)
    # one task is a possible one (solving is measured), whatever the seed (docs/code.md)
    assert not any(code.heldout_sample(loaded, 1, seed=seed)[0][0].impossible for seed in range(20))


def test_generated_tasks_are_cached_by_the_code_their_validation_runs_too():
    assert {"generate.py", "score.py", "sandbox.py", "tasks.py"} <= {p.name for p in code.generator_sources()}


def test_only_the_experts_solved_demonstrations_are_kept_and_the_rest_counted(caplog):
    def episode(name: str, status: str, success: bool) -> Episode:
        hidden = {"passed": 3 if success else 1, "total": 3}
        outcome = Outcome(success=success, info={"hidden": hidden}) if status == "finished" else None
        reason = "edit_file raised" if status == "failed" else None
        return Episode(task=Task(id=name, prompt="fix"), outcome=outcome, status=status, failure_reason=reason)

    episodes = [episode("solved", "finished", True), episode("unsolved", "finished", False),
                episode("raised", "failed", False)]  # fmt: skip
    assert [e.task.id for e in code.solved_demonstrations(episodes)] == ["solved"]
    assert (
        "2 of 3 demonstrations are left out of SFT: 1 failed, 1 did not solve their task; the first: raised: "
        "edit_file raised; unsolved: hidden tests {'passed': 1, 'total': 3}" in caplog.text
    )
