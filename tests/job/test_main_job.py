"""`harnessrl train` end to end at minimal size."""

import json
import math
import random
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError
from safetensors.torch import load_file

from harnessrl.envs.search.data import synthetic
from harnessrl.eval.evaluate import gain_ci
from harnessrl.job import code, main, swarm
from harnessrl.job.config import ConfigDefaultsWarning, DataConfig, JobConfig, SwarmJobConfig
from harnessrl.job.main import validation_split
from harnessrl.policy.tiny import build_tiny
from harnessrl.train import TrainConfig, Trainer
from harnessrl.train.trainer import _lr_factor
from harnessrl.types import Episode, Task, read_jsonl
from tests.conftest import cli

MINIMAL = """
model: tiny
data: {synthetic_people: 24}  # 18 training tasks: with the default 340, each run spent ~25 s demonstrating 256
eval_tasks: 2
eval_repeats: 1
agent: {max_turns: 2, max_tokens: 16}
sft: {steps: 1, batch_episodes: 4}
rl:
  updates: 1
  validation_tasks: 2
  validation_repeats: 1
  validate_every: 1
  rollout: {group_size: 2, groups_per_update: 1, staleness: 0}
"""


@pytest.fixture(scope="module")
def minimal_run(tmp_path_factory) -> Path:
    """One `harnessrl train` of MINIMAL, as a process; tests that change the run work on a copy."""
    root = tmp_path_factory.mktemp("minimal")
    (root / "job.yaml").write_text(MINIMAL)
    done = subprocess.run([sys.executable, "-m", "harnessrl", "train", str(root / "job.yaml"), "--out", str(root / "run")],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "run"


def test_train_runs_end_to_end_and_writes_the_run_folder(minimal_run):
    out = minimal_run
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "heldout_success_before",
        "heldout_success_after",
        "heldout_success_greedy_before",
        "heldout_success_greedy_after",
        "wall_seconds",
    ):
        assert key in summary
    assert summary["peak_memory_mb"] > 100  # a torch process holding a model
    plan = summary["sft_plan"]  # the embedded default's budget (900 s) planned its one step: all of them
    assert plan["steps"] == plan["of"] == plan["planned_at"] == 1 and plan["until_seconds"] == 540.0
    assert summary["training_trend"] == {"updates": 1, "window": 0, "alarms": []}  # too few updates to compare
    low, high = summary["heldout_gain_ci"]  # the paired bootstrap interval of after - before
    low_greedy, high_greedy = summary["heldout_gain_ci_greedy"]  # the same of the greedy episodes
    assert -1 <= low_greedy <= high_greedy <= 1 and isinstance(summary["heldout_alarms"], list)
    assert sum(summary["error_classes_before"].values()) == sum(summary["error_classes_after"].values()) == 2
    assert -1 <= low <= high <= 1
    by_docs = summary["heldout_by_gold_docs"]  # sampled success and calls by the tasks' number of gold documents
    assert sum(row["tasks"] for row in by_docs.values()) == 2 and set(by_docs) <= {"1", "2", "3"}
    assert all(
        0 <= row[f"success_{w}"] <= 1 and row[f"calls_{w}"] >= 1
        for row in by_docs.values()
        for w in ("before", "after")
    )
    for when in ("before", "after"):  # the same by the synthetic tasks' family (question template), recomputed
        held = read_jsonl(out / f"eval_{when}.jsonl", Episode)
        families = Counter(e.task.data["family"] for e in held)
        assert {name: row[f"success_{when}"] for name, row in summary["heldout_by_family"].items()} == {
            name: round(
                sum(bool(e.outcome and e.outcome.success) for e in held if e.task.data["family"] == name) / n, 4
            )
            for name, n in families.items()
        }
    for when in ("before", "after"):  # tokens sampled at p < 1 % per 1,000 drawn, recomputed from the episodes
        drawn = [
            lp for e in read_jsonl(out / f"eval_{when}.jsonl", Episode) for c in e.calls for lp in c.sampled_logprobs
        ]
        rare = 1000 * sum(lp < math.log(0.01) for lp in drawn) / len(drawn)
        assert summary[f"rare_draws_{when}"] == pytest.approx(rare, abs=0.006)
    sft = [json.loads(x) for x in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    rl = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("loss/sft" in s and "policy/staleness" not in s for s in sft) and len(sft) == 1
    assert len(rl) == 1 and "rollout/groups" in rl[0]  # an RL update (skipped when the group tied)
    assert rl[0]["reward/f_beta"] == 0.0 and "term/f_beta" in rl[0]  # at weight 0, measured before weighting
    hops = {k.split("_")[-1] for k in rl[0] if k.startswith("hops/success_")}  # the batch's task(s) by gold documents
    assert hops and hops <= {"1", "2", "3"} and all(rl[0][f"hops/calls_{n}"] >= 1 for n in hops)
    assert set(json.loads((out / "phases.json").read_text())) == {
        "setup",
        "demos",
        "sft",
        "eval_before",
        "rl",
        "eval_after",
    }
    for name in (
        "config.yaml",
        "demos.jsonl",
        "eval_before.json",
        "eval_before.jsonl",
        "eval_after.jsonl",
        "heldout.png",
        "rewards.png",
    ):
        assert (out / name).is_file(), name
    assert (out / "checkpoints" / "latest").is_file()
    (trained,) = [read_jsonl(p, Episode) for p in (out / "rollouts").iterdir()]  # update-0001.jsonl: what it trained on
    assert len(trained) == rl[0]["rollout/episodes"] and len({e.task.id for e in trained}) == rl[0]["rollout/groups"]
    shown = cli("inspect", trained[-1].id, "--run", out)  # found in rollouts/ by its id
    assert shown.exit_code == 0 and f"task {trained[-1].task.id}" in shown.stdout

    # the checkpoint is chosen on validation tasks set aside from the train split: before RL and after it
    validation = [json.loads(x) for x in (out / "validation.jsonl").read_text().splitlines()]
    assert [v["update"] for v in validation] == [0, 1] and all(v["episodes"] == 2 for v in validation)
    assert all(sorted(v["scores"]) == sorted(v["tasks"]) for v in validation)  # each task's scores
    assert validation[0]["p_above_update_0"] is None and 0 < validation[1]["p_above_update_0"] <= 1
    # rl.validation_p 0.2: the update replaces the warm start only where it validates above it beyond noise
    assert validation[0]["eligible"] and validation[1]["eligible"] == (validation[1]["p_above_update_0"] <= 0.2)
    chosen = 1 if validation[1]["eligible"] and validation[1]["success"] >= validation[0]["success"] else 0
    assert summary["chosen_update"] == chosen and summary["validation"] == validation[chosen]["success"]
    source = out / "checkpoints" / "step-000001" if chosen else out / "sft" / "checkpoints" / "step-000001"
    assert load_file(out / "best" / "model.safetensors").keys() == load_file(source / "model.safetensors").keys()
    assert all(
        torch.equal(v, load_file(source / "model.safetensors")[k])
        for k, v in load_file(out / "best" / "model.safetensors").items()
    )
    demos = {json.loads(x)["task"]["id"] for x in (out / "demos.jsonl").read_text().splitlines()}
    assert len(demos) >= 10 and len(validation[0]["tasks"]) == 2 and not demos & set(validation[0]["tasks"])


def test_when_validation_keeps_the_warm_start_its_eval_stands_for_the_eval_after(tmp_path):
    """The chosen weights are the ones eval_before measured (here: no update at all), so the held-out eval is
    not drawn again: a second sampled draw of the same weights would report noise as RL's gain."""
    job = yaml.safe_load(MINIMAL)
    job["sft"]["steps"], job["rl"]["updates"] = 0, 0
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    done = cli("train", tmp_path / "job.yaml", "--out", tmp_path / "run")
    assert done.exit_code == 0, done.output[-3000:]
    out = tmp_path / "run"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["chosen_update"] == 0 and summary["heldout_alarms"] == []
    assert summary["heldout_gain_ci"] == summary["heldout_gain_ci_greedy"] == [0.0, 0.0]
    assert summary["heldout_success_after"] == summary["heldout_success_before"]
    for suffix in (".json", ".jsonl", "_greedy.jsonl"):
        assert (out / f"eval_after{suffix}").read_bytes() == (out / f"eval_before{suffix}").read_bytes()
    assert summary["error_classes_after"] == summary["error_classes_before"]


def test_sft_leaves_out_failed_demonstrations_and_says_why_when_none_is_left(tmp_path, caplog):
    """A corpus of long documents: the expert's read of one passes tiny's context of 4096 tokens, the gateway refuses
    the request and the demonstration fails after its first search. SFT on such demonstrations would teach that
    search alone, silently."""
    words = "river harbour market bridge tower garden chapel mill".split()
    with open(tmp_path / "corpus.jsonl", "w") as f:
        for i in range(6):
            text = f"Town {i} was founded in {1500 + i}. " + " ".join(words[(i + n) % 8] for n in range(2500))
            f.write(json.dumps({"id": f"doc{i}", "title": f"Town {i}", "text": text}) + "\n")
    with open(tmp_path / "tasks.jsonl", "w") as f:
        for i in range(6):
            f.write(json.dumps({"id": f"q{i}", "question": f"When was Town {i} founded?", "answer": str(1500 + i),
                                "gold_doc_ids": [f"doc{i}"], "split": "test" if i == 0 else "train"}) + "\n")  # fmt: skip
    job = yaml.safe_load(MINIMAL)
    job["agent"] = {"context_budget": 3000, "max_tokens": 16}  # under it, the expert reads the gold document whole
    job["rl"]["validation_tasks"] = 0
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    args = ("--corpus", tmp_path / "corpus.jsonl", "--tasks", tmp_path / "tasks.jsonl", "--out", tmp_path / "run")
    done = cli("train", tmp_path / "job.yaml", *args)
    demos = read_jsonl(tmp_path / "run" / "demos.jsonl", Episode)
    assert len(demos) == 5 and all(e.status == "failed" and e.calls for e in demos)
    assert done.exit_code == 2 and "no demonstration has a completion to train on (5 failed; the first: harness" in (
        done.stderr
    ), done.output[-3000:]
    assert "fit the model's context of 4096" in done.stderr and not (tmp_path / "run" / "sft" / "checkpoints").exists()
    assert "5 of 5 demonstrations failed and are left out of SFT" in caplog.text


def test_heldout_alarms_name_what_rl_made_worse_beyond_noise_and_only_that():
    """Paired by task: 12 tasks (6 of each family) all answered before; after RL, 10 end in a malformed call.
    Sampled and greedy success fall, each family's too, and the malformed share rises beyond noise; where
    only one family falls, it is the only family named; the same episodes before and after raise nothing."""
    from harnessrl.envs.search.data import Doc
    from harnessrl.types import Call, Outcome

    documents = {"d": Doc(id="d", text="Lisa Brown was born in 1970.")}

    def episode(task: int, ok: bool) -> Episode:
        error = None if ok else "tool call 0: bad JSON: Expecting ',' delimiter at char 41"
        call = Call(
            prompt_ids=[1], completion_ids=[2], sampled_logprobs=[-0.1], policy_version=0, tool_call_error=error
        )
        outcome = Outcome(answer="1970", success=True, info={"doc_ids": ["d"]}) if ok else Outcome(success=False)
        data = {"gold_doc_ids": ["d"], "family": "birth_year" if task < 6 else "occupation"}
        return Episode(
            task=Task(id=f"t{task}", prompt="?", data=data), calls=[call], outcome=outcome, status="finished"
        )

    before = [episode(t, True) for t in range(12) for _ in range(2)]
    after = [episode(t, t < 2) for t in range(12) for _ in range(2)]
    held, greedy = {"before": before, "after": after}, {"before": before[::2], "after": after[::2]}
    falling = ["sampled_falling", "greedy_falling", "birth_year_falling", "occupation_falling"]
    assert main._heldout_alarms(held, greedy, documents) == [*falling, "malformed_call_rising"]
    same = {"before": before, "after": before}
    one = {"before": before, "after": before[:12] + after[12:]}  # birth_year kept, occupation lost
    assert main._heldout_alarms(one, same, documents) == [
        "sampled_falling",
        "occupation_falling",
        "malformed_call_rising",
    ]
    assert main._heldout_alarms(same, same, documents) == []
    kept = [*range(4), *range(6, 12)]  # birth_year's 4 tasks all lost, occupation's 6 kept: 4 are too few to name
    small = {"before": [episode(t, True) for t in kept for _ in range(2)]}
    small["after"] = [episode(t, t >= 4) for t in kept for _ in range(2)]
    assert main._heldout_alarms(small, same, documents) == ["sampled_falling", "malformed_call_rising"]
    # at the ceiling: all 12 tasks at 2 of 2 before, 4 of them at 1 of 2 after. Every task's gain is 0 or less, so
    # the bootstrap over tasks lies below 0, but one unchanged policy drawing 24 of 24 and then 20 of 24 is no rare event
    ceiling = {
        "before": before,
        "after": [episode(t, t not in (6, 7, 8, 9) or i == 0) for t in range(12) for i in range(2)],
    }
    assert gain_ci(ceiling["before"], ceiling["after"])[1] < 0
    assert main._heldout_alarms(ceiling, same, documents) == []
    low, high = gain_ci(greedy["before"], greedy["after"])  # 10 of 12 tasks lost: -10/12, resampled
    assert low == -1.0 and low < -10 / 12 < high < 0


def test_a_bad_config_key_fails_at_load_naming_it(tmp_path):
    (tmp_path / "job.yaml").write_text("rl:\n  updatez: 3\n")
    done = cli("train", tmp_path / "job.yaml", "--out", tmp_path / "r")
    assert done.exit_code == 2 and "updatez" in done.stderr and "job.yaml" in done.stderr
    (tmp_path / "job.yaml").write_text(
        "rl:\n  updates: [1\n model: x\n"
    )  # not YAML: the file and the line, no traceback
    done = cli("train", tmp_path / "job.yaml", "--out", tmp_path / "r")
    assert (
        done.exit_code == 2 and "job.yaml: line 3, column 7: not YAML: while parsing a flow sequence" in done.stderr
    ), done.output
    (tmp_path / "job.yaml").write_text("seed: 1\ndata: {corpus: c.jsonl}\n")  # a corpus needs its tasks
    done = cli("train", tmp_path / "job.yaml", "--out", tmp_path / "r")
    assert done.exit_code == 2 and "data.corpus and data.tasks go together" in done.stderr, done.output
    assert not (tmp_path / "r").exists()
    for bad, field in [({"sft": {"batch_episodes": 0}}, "sft.batch_episodes"), ({"sft": {"lr": 0}}, "sft.lr"),
                       ({"eval_tasks": -5}, "eval_tasks"), ({"seed": 1, "rl": {"train": {"seed": 2}}}, "rl.train.seed"),
                       ({"rl": {"updates": 3, "train": {"schedule": "cosine", "warmup_steps": 5}}}, "rl.train.warmup_steps"),
                       ({"rl": {"train": {"betas": [0.9, 1.5]}}}, "rl.train.betas"), ({"sft": {"lr": math.inf}}, "sft.lr"),
                       ({"budget_seconds": math.inf}, "budget_seconds"), ({"reward": {"f_beta": math.nan}}, "reward.f_beta"),
                       ({"rl": {"rollout": {"failure_reward": math.nan}}}, "rl.rollout.failure_reward"),
                       ({"swarm": {"subagent_temperature": 3.0}}, "swarm.subagent_temperature"),
                       ({"swarm": {"orchestrator_temperature": 3.0}}, "swarm.orchestrator_temperature")]:  # fmt: skip
        with pytest.raises(ValidationError, match=field):  # at load, not after the demonstrations
            JobConfig.model_validate(bad)
    assert JobConfig.model_validate({"seed": 3}).rl.train.seed == 3  # the job's seed seeds its trainers
    assert cli("make-corpus", tmp_path / "data").exit_code == 0
    tasks = (tmp_path / "data" / "tasks.jsonl").read_text().splitlines()
    (tmp_path / "data" / "tasks.jsonl").write_text("\n".join(tasks[:-1]) + "\n" + tasks[-1][:25])  # a cut last line
    data = ("--corpus", tmp_path / "data" / "corpus.jsonl", "--tasks", tmp_path / "data" / "tasks.jsonl")
    done = cli("train", *data, "--out", tmp_path / "r")
    assert done.exit_code == 2 and f"tasks.jsonl: line {len(tasks)}: " in done.stderr, done.output
    assert not (tmp_path / "r" / "config.yaml").exists()  # so the same --out takes the mended file's run
    (tmp_path / "many.yaml").write_text("data: {synthetic_people: 100000}\n")  # more than the generator has names
    done = cli("train", tmp_path / "many.yaml", "--out", tmp_path / "m")
    assert done.exit_code == 2 and "data.synthetic_people: 100000 is more than the" in done.stderr, done.output
    assert not (tmp_path / "m" / "config.yaml").exists()


def test_a_block_given_in_part_keeps_the_jobs_other_defaults_in_it(tmp_path):
    (tmp_path / "job.yaml").write_text("rl:\n  train: {lr: 3.0e-4}\nsft: {filter: null}\n")
    loaded, default = JobConfig.load(tmp_path / "job.yaml"), JobConfig()
    assert loaded.rl.train.lr == 3e-4
    # the main job's two passes of two mini-batches stay, not TrainConfig's own one step a batch
    assert (loaded.rl.train.ppo_epochs, loaded.rl.train.mini_batches) == (2, 2)
    assert (TrainConfig().ppo_epochs, TrainConfig().mini_batches) == (1, 1)
    assert loaded.rl.train.model_copy(update={"lr": default.rl.train.lr}) == default.rl.train
    assert loaded.model_copy(update={"rl": default.rl}) == default
    # a swarm: or code: block (absent by default) keeps that job's own defaults around what it sets
    (tmp_path / "swarm.yaml").write_text("swarm: {limits: {subagent_timeout: 60}, lambda_parallel: {start: 0.2}}\n")
    swarm_job, job_default = JobConfig.load(tmp_path / "swarm.yaml").swarm, SwarmJobConfig()
    assert swarm_job.limits == job_default.limits.model_copy(update={"subagent_timeout": 60.0})
    assert swarm_job.limits.max_critical_steps == 8 and swarm_job.lambda_parallel.kind != "constant"
    assert swarm_job.lambda_parallel == job_default.lambda_parallel.model_copy(update={"start": 0.2})
    built = JobConfig.model_validate({"swarm": {"limits": {"subagent_timeout": 60}}}).swarm  # the Python API too
    assert built.limits == swarm_job.limits
    (tmp_path / "bad.yaml").write_text("agent: {max_turns: 8}\nswarm: {limits: {max_critical_steps: 12}}\n")
    with pytest.raises(ValueError, match="max_subagent_steps 6 < agent.max_turns 8"):
        JobConfig.load(tmp_path / "bad.yaml")
    (tmp_path / "ray.yaml").write_text("rl: {rollout: {backend: ray}}\n")
    with pytest.raises(ValueError, match="rl.rollout.backend: ray: the jobs serve their policy in process"):
        JobConfig.load(tmp_path / "ray.yaml")


def test_a_decaying_rl_schedule_ends_at_the_jobs_last_update_unless_told_otherwise(tmp_path):
    (tmp_path / "job.yaml").write_text("rl: {updates: 12, train: {schedule: cosine}}\n")
    loaded = JobConfig.load(tmp_path / "job.yaml")
    assert loaded.rl.train.total_steps == 12  # one scheduler step an update: cosine reaches 0 at update 12
    assert JobConfig.model_validate(loaded.model_dump()).rl.train.total_steps == 12  # config.yaml reloads the same
    (tmp_path / "set.yaml").write_text("rl: {updates: 12, train: {schedule: cosine, total_steps: 40}}\n")
    assert JobConfig.load(tmp_path / "set.yaml").rl.train.total_steps == 40
    assert JobConfig().rl.train.total_steps == TrainConfig().total_steps  # constant: nothing to decay


def test_every_job_refuses_a_folder_holding_a_run_with_another_config(tmp_path):
    config = JobConfig.model_validate(yaml.safe_load(MINIMAL))
    main.start_run(config, tmp_path / "run")
    main.start_run(config, tmp_path / "run")  # the same run goes on
    other = config.model_copy(update={"seed": 3, "eval_tasks": 1})
    for job in (main, code, swarm):  # through the Python API too, before any work is done
        with pytest.raises(ValueError, match="differs in eval_tasks, seed(, swarm)?: continue it with --resume"):
            job.run(other.model_copy(update={"swarm": SwarmJobConfig()}) if job is swarm else other, tmp_path / "run")
    assert JobConfig.load(tmp_path / "run" / "config.yaml") == config


def test_an_update_replaces_the_warm_start_only_when_it_validates_beyond_noise_if_asked():
    warm = {f"t{i}": [0.0, 1.0] if i < 8 else [0.0, 0.0] for i in range(16)}  # update 0: 8 of 32
    records = [{"update": 0, "success": 0.25, "scores": warm, "eligible": True}]
    a_little = {t: [1.0, 1.0] if t in ("t0", "t1") else v for t, v in warm.items()}  # 10 of 32
    a_lot = {t: [1.0, 1.0] if int(t[1:]) < 12 else v for t, v in warm.items()}  # 24 of 32
    p_little, eligible, best = main.validation_choice(records, a_little, "success", 0.2)
    assert p_little > 0.2 and not eligible and not best  # 2 more successes of 32: noise, the warm start stays
    assert main.validation_choice(records, a_little, "success", 1.0) == (p_little, True, True)  # the old rule
    p_lot, eligible, best = main.validation_choice(records, a_lot, "success", 0.2)
    assert p_lot < 0.01 and eligible and best
    records += [{"update": 8, "success": 0.75, "scores": a_lot, "eligible": True}]
    assert main.validation_choice(records, a_little, "success", 1.0)[2] is False  # below the best eligible one
    records[1]["eligible"] = False  # an update that did not beat the warm start is never the bar to beat
    assert main.validation_choice(records, a_little, "success", 1.0)[2] is True
    assert main.validation_choice([], warm, "success", 0.2) == (None, True, True)  # update 0 always
    assert main.validation_choice([{"update": 0, "success": 0.25}], a_lot, "success", 0.2)[:2] == (None, True)


def test_the_validation_split_keeps_each_hop_counts_share_of_the_train_split():
    def task(n: int, hops: int) -> Task:
        return Task(id=f"q-{n}", prompt="?", data={"gold_doc_ids": [f"d-{n}-{h}" for h in range(hops)]})

    # the synthetic train split: 64 / 67 / 65 tasks of 1 / 2 / 3 hops, and one that names no gold document
    train = [task(n, 1 + (n >= 64) + (n >= 131)) for n in range(196)] + [task(196, 0)]
    picked = validation_split(train, 16, random.Random(0))
    # shares 16 x (1, 64, 67, 65) / 197 = 0.08, 5.20, 5.44, 5.28: floors 0 / 5 / 5 / 5, the one left to 5.44
    assert Counter(len(t.data["gold_doc_ids"]) for t in picked) == {1: 5, 2: 6, 3: 5}
    assert len({t.id for t in picked}) == 16 and all(t in train for t in picked)
    assert picked == validation_split(train, 16, random.Random(0)) != validation_split(train, 16, random.Random(1))
    assert validation_split(train, 0, random.Random(0)) == []


def test_fresh_tasks_are_set_aside_for_rl_by_hop_count_and_never_demonstrated():
    train = [Task(id=f"q-{n}", data={"gold_doc_ids": ["d"] * (1 + n % 3)}) for n in range(180)]
    demonstrated, fresh = main.fresh_split(train, 0.3, seed=0)
    assert len(fresh) == 54 and Counter(len(t.data["gold_doc_ids"]) for t in fresh) == {1: 18, 2: 18, 3: 18}
    assert {t.id for t in demonstrated} | {t.id for t in fresh} == {t.id for t in train}
    assert not {t.id for t in demonstrated} & {t.id for t in fresh}
    assert main.fresh_split(train, 0.3, seed=1)[1] != fresh == main.fresh_split(train, 0.3, seed=0)[1]
    assert main.fresh_split(train, 0.0, seed=0) == (train, [])


def test_a_run_with_fresh_tasks_demonstrates_only_the_rest(tmp_path):
    config = yaml.safe_load(MINIMAL)
    config["rl"]["fresh_tasks"] = 0.5
    config["rl"]["updates"], config["rl"]["rollout"]["groups_per_update"] = 2, 4  # 8 tasks: RL's draw shows
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    done = cli("train", tmp_path / "job.yaml", "--out", tmp_path / "run")
    assert done.exit_code == 0, done.stderr[-3000:]
    validation = set(json.loads((tmp_path / "run" / "validation.jsonl").read_text().splitlines()[0])["tasks"])
    train = [
        t.task()
        for t in synthetic(0, people=config["data"]["synthetic_people"])[1]
        if t.split == "train" and t.id not in validation
    ]
    demonstrated, fresh = main.fresh_split(train, 0.5, seed=0)
    demos = read_jsonl(tmp_path / "run" / "demos.jsonl", Episode)
    assert sorted(e.task.id for e in demos) == sorted(t.id for t in demonstrated) and len(fresh) == len(train) // 2
    rollouts = sorted((tmp_path / "run" / "rollouts").glob("*.jsonl"))  # what each RL update trained on
    assert [p.name for p in rollouts] == [f"update-{n:04d}.jsonl" for n in range(1, config["rl"]["updates"] + 1)]
    trained = {e.task.id for p in rollouts for e in read_jsonl(p, Episode)}
    assert trained and trained <= {t.id for t in fresh}


def test_fresh_tasks_belong_to_the_search_job_and_leave_guidance_nothing_to_guide():
    with pytest.raises(ValueError, match="swarm.rl_questions"):
        JobConfig.model_validate({"rl": {"fresh_tasks": 0.3}, "swarm": {}})
    with pytest.raises(ValueError, match="rl.guidance"):
        JobConfig.model_validate({"rl": {"fresh_tasks": 0.3, "guidance": True}})
    assert JobConfig.model_validate({"rl": {"fresh_tasks": 0.3}}).rl.fresh_tasks == 0.3


def test_a_run_config_written_before_a_key_existed_is_resumed_with_a_warning_naming_it(tmp_path):
    config = JobConfig.model_validate(yaml.safe_load(MINIMAL))
    main.start_run(config, tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a config.yaml the job wrote itself sets every key: no warning
        assert JobConfig.load_run(tmp_path / "run") == config
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    del written["rl"]["train"]["entropy_coef"], written["eval_repeats"]  # as a run of an older harnessrl
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(written))
    # the run used eval_repeats 1; today's default is 2, which the run would now take: said, not silent
    with pytest.warns(ConfigDefaultsWarning, match=r"rl.train.entropy_coef \(now -0.1\), eval_repeats \(now 2\)"):
        assert JobConfig.load_run(tmp_path / "run").eval_repeats == 2
    with pytest.warns(ConfigDefaultsWarning, match="entropy_coef"):  # and a fresh run into that folder
        main.start_run(config.model_copy(update={"eval_repeats": 2}), tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        JobConfig.load_run(tmp_path)


def test_a_run_from_another_runs_warm_start_copies_it_and_runs_only_rl(minimal_run, tmp_path):
    config = yaml.safe_load((minimal_run / "config.yaml").read_text())
    config["rl"]["updates"], config["rl"]["train"]["lr"] = 2, 3e-4  # RL keys may differ
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "rl-run"
    done = subprocess.run([sys.executable, "-m", "harnessrl", "train", str(tmp_path / "rl.yaml"), "--warm-start",
                           str(minimal_run), "--out", str(out)], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("demos.jsonl", "eval_before.json", "eval_before.jsonl", "sft/metrics.jsonl"):
        assert (out / name).read_text() == (minimal_run / name).read_text()  # copied: no demo or SFT step made again
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rl_updates"] == 2 and len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert summary["warm_start"] == str(minimal_run.resolve())
    copied = json.loads((minimal_run / "phases.json").read_text())
    assert summary["phase_seconds"]["sft"] == copied["sft"] and "rl" in summary["phase_seconds"]  # the whole job's
    # what made the warm start may not differ: the seed, SFT, the validation tasks
    config["seed"], config["sft"]["steps"], config["rl"]["validation_tasks"] = 1, 2, 3
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(config))
    bad = cli("train", tmp_path / "other.yaml", "--warm-start", minimal_run, "--out", tmp_path / "other")
    assert bad.exit_code == 2 and "differs in rl.validation_tasks, seed, sft.steps" in bad.stderr
    assert not (tmp_path / "other").exists()
    mixed = cli("train", tmp_path / "rl.yaml", "--warm-start", minimal_run, "--out", minimal_run)  # a run of its own
    assert mixed.exit_code == 2 and "not started from the warm start" in mixed.stderr


def test_sft_fitted_to_a_budget_stays_that_long_in_a_warm_start_without_one(minimal_run, tmp_path):
    fitted = tmp_path / "fitted"  # a run whose budget fitted SFT to 1 of its 3 steps
    shutil.copytree(minimal_run, fitted)
    config = yaml.safe_load((fitted / "config.yaml").read_text())
    config["sft"]["steps"] = 3
    (fitted / "config.yaml").write_text(yaml.safe_dump(config))
    plan = {**json.loads((fitted / "sft" / "plan.json").read_text()), "of": 3}
    (fitted / "sft" / "plan.json").write_text(json.dumps(plan))
    config["budget_seconds"], config["sft"]["budget_share"] = None, 0.9  # free: neither changes the copied SFT
    (tmp_path / "null.yaml").write_text(yaml.safe_dump(config))
    done = cli("train", tmp_path / "null.yaml", "--warm-start", fitted, "--out", tmp_path / "run")
    assert done.exit_code == 0, done.output[-3000:]
    sft = (tmp_path / "run" / "sft" / "metrics.jsonl").read_text()
    assert sft == (fitted / "sft" / "metrics.jsonl").read_text() and len(sft.splitlines()) == 1  # no SFT step more
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["sft_plan"] == plan


def test_a_time_budget_spent_before_rl_leaves_the_warm_start_and_says_so(minimal_run, tmp_path, caplog):
    """budget_seconds ends RL at the first update after which one more, a validation and the eval after would not
    fit; here the copied phases alone are over it, so RL makes none, and a resume does not go on."""
    config = yaml.safe_load((minimal_run / "config.yaml").read_text())
    config["rl"]["updates"], config["budget_seconds"] = 3, 0.5
    (tmp_path / "budget.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    done = cli("train", tmp_path / "budget.yaml", "--warm-start", minimal_run, "--out", out)
    assert done.exit_code == 0, done.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    stop = summary["budget_stop"]
    assert summary["rl_updates"] == 0 and summary["chosen_update"] == 0 and not (out / "metrics.jsonl").exists()
    assert stop["update"] == 0 and stop["budget"] == 0.5 and stop["projected_seconds"] > stop["seconds"] > 0.5
    assert summary["budget_seconds"] == 0.5 and "budget_seconds 0.5: RL ends at update 0 of 3" in caplog.text
    assert (out / "eval_after.jsonl").read_bytes() == (out / "eval_before.jsonl").read_bytes()
    again = cli("train", "--resume", out)
    assert again.exit_code == 0 and json.loads((out / "summary.json").read_text())["rl_updates"] == 0


def test_the_budget_counts_the_rl_seconds_of_a_start_killed_before_this_one(tmp_path):
    (tmp_path / "phases.json").write_text(
        json.dumps({"setup": 1.0, "sft": 10.0, "eval_before": 5.0, "rl (unfinished)": 100.0})
    )
    job = main._Job(JobConfig(budget_seconds=50), tmp_path, progress=False)
    job._current = ("rl", time.perf_counter())  # resumed in RL
    stop = job._over_budget(0.0, 3)
    assert stop is not None and stop["update"] == 3 and stop["seconds"] >= 116.0
    (tmp_path / "phases.json").write_text(json.dumps({"setup": 1.0, "sft": 10.0, "eval_before": 5.0}))
    job = main._Job(JobConfig(budget_seconds=50), tmp_path, progress=False)
    job._current = ("rl", time.perf_counter())
    assert job._over_budget(0.0, 3) is None  # 16 s spent, an eval after of 5: within it


def test_under_a_budget_sft_is_planned_to_end_by_its_share_and_decays_over_the_planned_steps(tmp_path, caplog):
    """After the warm-up the job fits SFT's steps to sft.budget_share of the budget at the pace measured so far (the
    first step left out); the schedule then decays over them as it would have, planned from the start."""
    (tmp_path / "phases.json").write_text(json.dumps({"setup": 4.0, "demos": 5.5}))
    config = JobConfig(model="tiny", budget_seconds=100)  # sft: 230 steps, 5 of warm-up, budget_share 0.6
    job = main._Job(config, tmp_path, progress=False)
    (tmp_path / "sft").mkdir()  # the SFT trainer's run_dir, made before any plan
    model, tokenizer = build_tiny(seed=0)
    warm = TrainConfig(lr=1e-3, schedule="cosine", total_steps=230, warmup_steps=5)
    trainer = Trainer(model, tokenizer, warm)
    for _ in range(15):
        trainer.scheduler.step()
    trainer.step = 15
    job._current = ("sft", time.perf_counter())
    plan = job._plan_sft(trainer, [9.0] + [1.0] * 14)  # 9.5 s spent: 50.5 s more at 1 s a step
    assert plan["steps"] == 65 and plan["of"] == 230 and plan["seconds_per_step"] == 1.0 and plan["planned_at"] == 15
    assert json.loads((tmp_path / "sft" / "plan.json").read_text()) == plan == job._read_sft_plan()
    assert "sft: 65 of sft.steps 230" in caplog.text
    factor = _lr_factor(warm.model_copy(update={"total_steps": 65}))  # the schedule planned from the start
    for step in range(15, 65):
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * factor(step))
        trainer.scheduler.step()
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0  # decayed to 0 at the 65th step
    fast = main._Job(config, tmp_path / "fast", progress=False)
    (tmp_path / "fast" / "sft").mkdir(parents=True)
    fast._current = ("sft", time.perf_counter())
    assert fast._plan_sft(trainer, [0.5, 0.1])["steps"] == 230  # a fast CPU trains them all


def test_the_budget_is_fifteen_minutes_for_the_embedded_default_only_unless_set():
    assert JobConfig().budget() == JobConfig(model="tiny-base-long").budget() == 900.0
    assert JobConfig(model="smollm2-135m-instruct").budget() is None  # a real model: rl.updates, however long
    assert JobConfig(data=DataConfig(corpus="c.jsonl", tasks="t.jsonl")).budget() is None  # your corpus: the same
    assert JobConfig(budget_seconds=None).budget() is None and JobConfig(budget_seconds=60).budget() == 60.0
    with pytest.raises(ValueError, match="budget_seconds"):
        JobConfig(budget_seconds=0)


def test_resume_keeps_finished_phases_and_continues_sft_and_rl_from_checkpoints(minimal_run, tmp_path):
    (tmp_path / "job.yaml").write_text(MINIMAL)
    out = tmp_path / "run"
    shutil.copytree(minimal_run, out)
    train = [sys.executable, "-m", "harnessrl", "train"]
    demos = (out / "demos.jsonl").read_text()
    before = (out / "eval_before.json").read_text()
    # ask for one more SFT step and one more RL update, as if the run had stopped there
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["sft"]["steps"], config["rl"]["updates"] = 2, 2
    config["sft"]["schedule"] = "constant"  # cosine would end the second step at lr 0
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    for name in ("eval_after.json", "summary.json"):
        (out / name).unlink()
    # the run's validation split as an earlier harnessrl drew it: the resumed run keeps validating on it
    records = (out / "validation.jsonl").read_text().splitlines()
    started_with = sorted(json.loads(x)["task"]["id"] for x in demos.splitlines())[:2]
    (out / "validation.jsonl").write_text(  # and a record a kill cut short
        "".join(json.dumps({**json.loads(r), "tasks": started_with}) + "\n" for r in records) + '{"update": 2, "su'
    )
    (out / "best").replace(out / ".best.old")  # killed while best/ was being replaced: the old one comes back
    with open(out / "sft" / "metrics.jsonl", "a") as f:  # a step logged after the last checkpoint, and one cut short
        f.write(json.dumps({"step": 2, "loss/sft": 9.0}) + '\n{"step": 3, "lo')
    phases = json.loads((out / "phases.json").read_text())  # killed in RL after a save: its seconds so far
    phases = {k: v for k, v in phases.items() if k not in ("rl", "eval_after")} | {"rl (unfinished)": 7.5}
    (out / "phases.json").write_text(json.dumps(phases))
    done = subprocess.run([*train, "--resume", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "demos.jsonl").read_text() == demos and (out / "eval_before.json").read_text() == before  # kept
    sft_lines = [json.loads(x) for x in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in sft_lines] == [1, 2]  # the second run made only the missing step
    assert sft_lines[-1]["optim/lr"] == pytest.approx(config["sft"]["lr"])  # at the schedule the run asked for
    rl_lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rl_lines) == 2 and json.loads((out / "summary.json").read_text())["rl_updates"] == 2
    validated = [json.loads(x) for x in (out / "validation.jsonl").read_text().splitlines()]
    assert [r["update"] for r in validated] == [0, 1, 2]  # nothing validated twice
    assert all(sorted(r["tasks"]) == started_with for r in validated)
    assert (out / "best" / "chosen.json").is_file() and not (out / ".best.old").exists()
    phases = json.loads((out / "phases.json").read_text())  # the killed start's RL seconds stay in the job's
    assert phases["rl"] > 7.5 and "eval_after" in phases and not [k for k in phases if "unfinished" in k]
    assert phases["sft"] > json.loads((minimal_run / "phases.json").read_text())["sft"]  # and its one more step
    bad = cli("train", tmp_path / "job.yaml", "--resume", out)
    assert bad.exit_code == 2 and "--resume" in bad.stderr
    # a fresh run into the folder, with a config that now differs from the folder's, is refused
    other = cli("train", tmp_path / "job.yaml", "--out", out)
    assert (
        other.exit_code == 2
        and "differs in rl.updates, sft.schedule, sft.steps" in other.stderr
        and "--resume" in other.stderr
    )


KILLED_AT_A_SAVE = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from harnessrl.job import main
    from harnessrl.job.config import JobConfig
    from harnessrl.train import Trainer

    saved = Trainer.save

    def save(self, directory, *args, **kwargs):  # killed before it writes checkpoint argv[4] of folder argv[3]
        if directory.parent.name == sys.argv[3] and kwargs.get("number", self.step) == int(sys.argv[4]):
            os._exit(9)
        return saved(self, directory, *args, **kwargs)

    Trainer.save = save
    main.run(JobConfig.load(Path(sys.argv[1])), Path(sys.argv[2]), progress=False)
""")


def _killed_then_resumed(config: Path, out: Path, folder: str, number: int) -> None:
    killed = subprocess.run([sys.executable, "-c", KILLED_AT_A_SAVE, config, out, folder, str(number)],
                            capture_output=True, text=True, timeout=900)  # fmt: skip
    assert killed.returncode == 9, killed.stderr[-3000:]
    done = subprocess.run([sys.executable, "-m", "harnessrl", "train", "--resume", str(out)], capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_resumed_sft_trains_as_the_run_that_went_on(tmp_path):
    """Its batches were drawn from a generator seeded with the step it resumed at: other batches than the run that
    was not stopped would have drawn."""
    config = yaml.safe_load(MINIMAL)
    config["sft"] |= {"steps": 4, "save_every": 2, "batch_episodes": 2}
    config["rl"] |= {"updates": 0, "validation_tasks": 0}  # no RL: no validation to choose with
    config["budget_seconds"] = None
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    whole = subprocess.run([sys.executable, "-m", "harnessrl", "train", tmp_path / "job.yaml", "--out", tmp_path / "a"],
                           capture_output=True, text=True, timeout=900)  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-3000:]
    _killed_then_resumed(tmp_path / "job.yaml", tmp_path / "b", "sft", 4)  # resumed from step 2
    weights = [load_file(tmp_path / run / "sft" / "checkpoints" / "step-000004" / "model.safetensors") for run in "ab"]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_resumed_run_validates_and_chooses_only_weights_of_updates_it_kept(tmp_path):
    """Validation ran before the checkpoint: killed at a save, the resumed run redid the updates after its last
    checkpoint but kept their validation records and best/, weights of updates no checkpoint held."""
    config = yaml.safe_load(MINIMAL)
    config["rl"] |= {"updates": 3, "save_every": 3, "validation_p": 1.0}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    _killed_then_resumed(tmp_path / "job.yaml", out, "run", 3)
    validated = [json.loads(x)["update"] for x in (out / "validation.jsonl").read_text().splitlines()]
    assert validated == [0, 1, 2, 3]
    for update in validated[1:]:  # each validated update is a checkpoint of this run's lineage
        assert (out / "checkpoints" / f"step-{update:06d}" / "model.safetensors").is_file()
    chosen = json.loads((out / "best" / "chosen.json").read_text())["update"]
    if chosen:
        best = load_file(out / "best" / "model.safetensors")
        kept = load_file(out / "checkpoints" / f"step-{chosen:06d}" / "model.safetensors")
        assert all(torch.equal(best[k], kept[k]) for k in best)


def test_sft_whose_every_step_is_skipped_stops_naming_the_rate(tmp_path):
    """A skipped step (a loss that was not finite) raised KeyError; drawing the next batch instead, a run whose every
    batch is skipped would go on forever."""
    config = yaml.safe_load(MINIMAL)
    config["sft"] |= {"steps": 30, "lr": 1.0e30, "schedule": "constant"}
    config["rl"] |= {"updates": 0, "validation_tasks": 0}  # no RL: no validation to choose with
    config["budget_seconds"] = None
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "harnessrl", "train", tmp_path / "job.yaml", "--out", tmp_path / "r"],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 2 and "10 batches in a row at step 1" in done.stderr and "sft.lr" in done.stderr


def test_a_mistyped_model_or_tool_format_fails_before_the_run_folder_holds_a_config(tmp_path):
    for args, named in [
        (("--model", "tiny-bsae"), "--model / model:"),
        (("--tool-format", "hermse"), "'--tool-format'"),
    ]:
        refused = cli("train", "--out", tmp_path / "run", *args)
        assert refused.exit_code == 2 and named in refused.stderr, refused.stderr
        assert not (tmp_path / "run" / "config.yaml").exists()
    for command in ("serve", "probe", "eval"):  # the same choice on every command that takes it
        refused = cli(command, "--tool-format", "hermse")
        assert refused.exit_code == 2 and "Invalid value for '--tool-format'" in refused.stderr, refused.stderr
    (tmp_path / "job.yaml").write_text("tool_format: hermse\n")
    refused = cli("train", tmp_path / "job.yaml", "--out", tmp_path / "run")
    assert refused.exit_code == 2 and f"{tmp_path / 'job.yaml'}: tool_format:" in refused.stderr, refused.stderr
    with pytest.raises(ValueError, match="--model / model: 'missing-model'"):
        main.start_run(JobConfig(model="missing-model"), tmp_path / "api")
    assert not (tmp_path / "api").exists()


def test_a_runs_relative_paths_are_kept_absolute_so_resume_works_from_another_directory(tmp_path, monkeypatch):
    from harnessrl.envs.search.data import write_corpus
    from harnessrl.policy.tiny import build_tiny

    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "data", *synthetic(0, people=12))
    build_tiny()[0].config.save_pretrained(tmp_path / "model")  # a folder `model:` may name (config.json)
    relative = {"data": {"corpus": "data/corpus.jsonl", "tasks": "data/tasks.jsonl"}, "model": "model"}
    main.start_run(JobConfig.model_validate(relative), Path("run"))
    held = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (
        held["data"]["corpus"] == str(tmp_path / "data" / "corpus.jsonl") and Path(held["data"]["tasks"]).is_absolute()
    )
    assert held["model"] == str(tmp_path / "model")
    main.start_run(JobConfig.model_validate(relative), Path("run"))  # the same command again: the same run
    older = dict(held, model="model", data=dict(held["data"], **relative["data"]))  # written before: relative
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(older))
    main.start_run(JobConfig.model_validate(relative), Path("run"))  # still the same run, read from here
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert JobConfig.load_run(tmp_path / "run").data.corpus.is_file()  # what --resume reads, found from here
