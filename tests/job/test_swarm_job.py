"""`harnessrl train` with a `swarm:` section, end to end at minimal size: the frozen sub-agent's search
job runs first (its best/ is absent), then demonstrations, SFT, baseline, RL with swarm metrics, eval."""

import json
import subprocess
import sys

import pytest
import yaml
from pydantic import ValidationError

from harnessrl.job import swarm
from harnessrl.job.config import JobConfig
from harnessrl.job.swarm import _SwarmJob, search_config
from harnessrl.types import Call, Episode
from tests.conftest import cli
from tests.job.test_main_job import KILLED_AT_A_SAVE

MINIMAL = """
model: tiny
data: {synthetic_people: 16}
eval_tasks: 1
eval_repeats: 1
agent: {max_turns: 2, max_tokens: 16}
sft: {steps: 1, batch_episodes: 2}
swarm:
  {subagent_run: SEARCH, subagent_config: SEARCH.yaml, width: 3, orchestrator_max_tokens: 320,
   limits: {max_orchestrator_steps: 2, max_critical_steps: 4}}  # one round: delegate, answer
rl:
  updates: 1
  validation_tasks: 2
  validation_repeats: 1
  validate_every: 1
  rollout: {group_size: 2, groups_per_update: 1, staleness: 0}
"""


def test_the_swarm_job_trains_its_sub_agent_first_then_the_orchestrator(tmp_path, monkeypatch):
    (tmp_path / "swarm.yaml").write_text(MINIMAL.replace("SEARCH", str(tmp_path / "search")))
    (tmp_path / "search.yaml").write_text(
        yaml.safe_dump({k: v for k, v in yaml.safe_load(MINIMAL).items() if k != "swarm"})
    )
    # the search job stopped at its first RL checkpoint, its best/ already written (update 0 validated): finished first
    killed = subprocess.run([sys.executable, "-c", KILLED_AT_A_SAVE, tmp_path / "search.yaml", tmp_path / "search",
                             "search", "1"], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert killed.returncode == 9 and (tmp_path / "search" / "best" / "config.json").is_file(), killed.stderr[-3000:]
    out = tmp_path / "run"
    train = [sys.executable, "-m", "harnessrl", "train"]
    done = subprocess.run(
        [*train, str(tmp_path / "swarm.yaml"), "--out", str(out)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "search" / "summary.json").is_file()  # the search main job ran to its end first, with its config
    search = yaml.safe_load((tmp_path / "search" / "config.yaml").read_text())
    assert search["swarm"] is None and search["sft"]["steps"] == 1 and search["rl"]["updates"] == 1
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["subagent_model"] == str(tmp_path / "search" / "best") and summary["width"] == 3
    for key in ("f1_single", "f1_swarm", "f1_swarm_before_rl", "f1_swarm_scripted"):
        assert 0 <= summary[key] <= 1
    assert summary["critical_steps_single"] == summary["total_steps_single"] > 0  # the baseline is all serial
    assert summary["critical_steps_reduction"] > 0
    for suffix in ("", "_greedy"):  # one held-out task, one episode: the paired interval is its gain
        gain = round(summary[f"f1_swarm{suffix}"] - summary[f"f1_swarm{suffix}_before_rl"], 4)
        assert summary[f"f1_swarm_gain_ci{suffix}"] == [gain, gain]
    assert summary["heldout_alarms"] == []  # one task of one episode: no fall can be told from noise
    (rl,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"swarm/spawn_rate", "swarm/critical_steps", "swarm/lambda_parallel", "alarm/serial_collapse"} <= set(rl)
    assert (out / "swarm.png").stat().st_size > 0
    # the checkpoint is chosen on validation tasks of held-out train questions, by item-F1
    records = [json.loads(x) for x in (out / "validation.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == [0, 1] and all(0 <= r["item_f1"] <= 1 for r in records)
    assert records[0]["tasks"] == ["wide-validation-0"]
    assert summary["chosen_update"] == json.loads((out / "best" / "chosen.json").read_text())["update"]
    assert summary["validation"] == max(r["item_f1"] for r in records)
    demos = [json.loads(x) for x in (out / "demos.jsonl").read_text().splitlines()]
    assert all({c["agent"] for c in d["calls"]} == {"main", "searcher"} for d in demos)  # the expert delegated
    again = cli("train", "--resume", out)  # in this process: a finished run's resume only reads
    assert again.exit_code == 0, again.output[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["f1_swarm"] == summary["f1_swarm"]
    # the same run started afresh, the sub-agent named relative to the working directory: it goes on
    (tmp_path / "relative.yaml").write_text(MINIMAL.replace("SEARCH", "search"))
    monkeypatch.chdir(tmp_path)
    fresh = cli("train", "relative.yaml", "--out", "run")
    assert fresh.exit_code == 0, fresh.output[-3000:]
    assert json.loads(fresh.stdout.strip().splitlines()[-1])["f1_swarm"] == summary["f1_swarm"]


def test_the_sub_agent_is_trained_by_the_main_jobs_own_phases_on_this_jobs_data(tmp_path):
    config = JobConfig.model_validate(yaml.safe_load(MINIMAL.replace("SEARCH", str(tmp_path / "search"))))
    config.swarm.subagent_config = None
    search = search_config(config)
    assert search.swarm is None and search.data == config.data and search.agent == config.agent
    assert search.sft == JobConfig().sft and search.rl == JobConfig().rl  # not the swarm job's SFT / RL sizes
    assert search.model == "tiny"  # the orchestrator's base, unless the sub-agent's is named
    config.swarm.subagent_base = "tiny-base"
    assert search_config(config).model == "tiny-base"
    (tmp_path / "bad.yaml").write_text(MINIMAL.replace("SEARCH", str(tmp_path / "search")))
    config.swarm.subagent_config = tmp_path / "bad.yaml"
    with pytest.raises(ValueError, match="a search main job with validation"):
        search_config(config)
    with pytest.raises(ValidationError, match="width 20: over limits.max_parallel"):
        JobConfig.model_validate({"swarm": {"width": 20}})
    with pytest.raises(ValidationError, match="orchestrator_temperature"):  # greedy is the greedy evals' business
        JobConfig.model_validate({"swarm": {"orchestrator_temperature": 0}})
    with pytest.raises(ValidationError, match="max_critical_steps: 7 leaves no room .* = 8"):
        JobConfig.model_validate({"swarm": {"limits": {"max_critical_steps": 7}}})  # agent.max_turns 6


def test_swarm_configs_the_job_cannot_honour_are_refused_before_the_folder_holds_them(tmp_path):
    for given, said in [
        ({"rl": {"guidance": True}}, "rl.guidance is the search job's"),
        ({"sft": {"filter": {}}}, "sft.filter is the search job's"),
        ({"swarm": {"limits": {"max_orchestrator_steps": 1}}}, "max_orchestrator_steps: at least 2"),
    ]:
        with pytest.raises(ValueError, match=said):
            JobConfig.model_validate({"swarm": {}, **given} if "swarm" not in given else given)
    for key in ("subagent_model", "subagent_base"):  # a typo names its key, and the folder stays empty
        config = JobConfig.model_validate({"swarm": {key: "tiny-bse"}})
        with pytest.raises(ValueError, match=f"swarm.{key}: --model / model: 'tiny-bse' is not one of"):
            swarm.run(config, tmp_path / key)
        assert not (tmp_path / key / "config.yaml").exists()


def test_demonstrations_longer_than_the_orchestrator_may_write_are_refused(tmp_path):
    def demo(tokens: int, trainable: bool = True) -> Episode:
        call = Call(prompt_ids=[1], completion_ids=[2] * tokens, sampled_logprobs=[0.0] * tokens,
                    policy_version=0, trainable=trainable)  # fmt: skip
        return Episode(calls=[call])

    config = JobConfig.model_validate({"swarm": {"orchestrator_max_tokens": 100}})
    job = _SwarmJob(config, tmp_path, False, "sub")
    fits = [demo(100), demo(500, trainable=False)]  # a frozen sub-agent's reply is not the policy's to write
    assert job._fits(fits) == fits
    with pytest.raises(ValueError, match=r"swarm.orchestrator_max_tokens: 100 .* longest reply \(101 tokens"):
        job._fits([demo(20), demo(101)])


def test_when_validation_keeps_the_sft_weights_the_evals_before_rl_stand_for_the_evals_after(tmp_path):
    """Both of them (sampled and greedy, each a .json and a .jsonl): a second sampled draw of the same weights
    would report noise as RL's effect (2026-12-04: 0.335 then 0.272 item-F1 on the SFT weights)."""
    job = _SwarmJob(JobConfig.model_validate({"swarm": {}}), tmp_path, False, "sub")
    for name in ("eval_before", "eval_before_greedy"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"f1": len(name)}))
        (tmp_path / f"{name}.jsonl").write_text(f"{name} episodes\n")
    job._reuse_eval_before()
    for name in ("eval_after", "eval_after_greedy"):
        for suffix in (".json", ".jsonl"):
            before = tmp_path / (name.replace("after", "before") + suffix)
            assert (tmp_path / f"{name}{suffix}").read_bytes() == before.read_bytes()
    (tmp_path / "eval_before.json").write_text("{}")
    job._reuse_eval_before()  # eval_after is done: never overwritten
    assert json.loads((tmp_path / "eval_after.json").read_text()) == {"f1": len("eval_before")}


def test_rl_questions_are_never_demonstrated_validated_or_tested():
    from harnessrl.envs.search import synthetic
    from harnessrl.job.swarm import wide_splits

    _, items = synthetic(0, people=120)
    config = JobConfig.model_validate({"swarm": {"rl_questions": 0.3}, "rl": {"validation_tasks": 2}})

    def questions(tasks):
        return {q for t in tasks for q in t.data["questions"]}

    validation, train, rl_train, test = wide_splits(items, config)
    n_train = sum(t.split == "train" for t in items)
    assert len(questions(validation)) == 2 * 8 and len(questions(rl_train)) == round(0.3 * (n_train - 16))
    assert all(t.id.startswith("wide-rl-") for t in rl_train)
    parts = [questions(x) for x in (validation, train, rl_train, test)]
    assert sum(map(len, parts)) == len(set().union(*parts)) == n_train + len(questions(test))  # disjoint, all used
    config.swarm.rl_questions = 0.0
    again = wide_splits(items, config)
    assert again[2] is again[1] and again[0] == validation and again[3] == test  # RL on the demonstrated tasks


def test_width_past_max_parallel_is_refused_only_where_one_assign_tasks_call_holds_it():
    each = JobConfig.model_validate({"swarm": {"width": 20, "assign": "each"}})  # runs past 16 wait for a slot
    assert each.swarm.width == 20
    with pytest.raises(ValidationError, match=r"width 40: over limits.max_assignments \(32\)"):
        JobConfig.model_validate({"swarm": {"width": 40, "assign": "each"}})


def test_every_phase_gets_the_episode_timeout_rl_gets(tmp_path):
    """RL took max(rl.rollout.episode_timeout, the limits' share) and validation the limits' share alone; now one
    helper: the rollout's allowance for the orchestrator's own replies plus each step's tool calls at their longest
    (with max_parallel 2 of 8 assignments, a reply's runs go in 4 rounds)."""
    limits = {"max_parallel": 2, "max_assignments": 8, "subagent_timeout": 10, "max_orchestrator_steps": 3}
    config = JobConfig.model_validate(
        {"swarm": {"width": 2, "limits": limits}, "rl": {"rollout": {"episode_timeout": 500}}}
    )
    assert config.swarm.limits.tool_seconds() == 4 * 10 + 30
    assert _SwarmJob(config, tmp_path, False, "sub")._episode_seconds() == 500 + 3 * (4 * 10 + 30)


def test_validation_tasks_cut_by_the_quarter_cap_are_said(caplog):
    from harnessrl.envs.search import synthetic
    from harnessrl.job.swarm import wide_splits

    _, items = synthetic(0, people=40)  # 28 train questions: a quarter holds no task of 8
    validation, *_ = wide_splits(items, JobConfig.model_validate({"swarm": {}, "rl": {"validation_tasks": 2}}))
    assert validation == []
    assert (
        "rl.validation_tasks: 2 asked, 0 set aside (a quarter of the 28 train questions, 8 a task): no validation"
        in caplog.text
    )
