"""`harnessrl eval` end to end at minimal size, and its metrics and intervals by hand."""

import json
import subprocess
import sys
from collections import Counter

import pytest

from harnessrl.eval.evaluate import (
    CheckpointError,
    bootstrap_ci,
    by_rare_draws,
    critical_steps,
    episode_metrics,
    gain_ci,
    paired_gain,
    permutation_p,
    rare_draws,
    resolve_checkpoint,
    summarize,
    tool_errors,
)
from harnessrl.types import Call, Episode, Outcome, Task
from tests.conftest import cli

DOCS = {
    "tova": "Tova Reln was a weaver born in 1802 in the town of Miralo.",
    "miralo": "Miralo is a town in Quasul. The fields around Miralo grow flax.",
    "quasul": "Quasul is a country founded in 1211. Its capital is Brethos.",
    "osk": "Osk Drafin was a miller born in 1750 in the town of Brethos.",
}
TASKS = [  # id, question, answer, gold document, split, family (optional)
    ("q0", "What was the occupation of Tova Reln?", "weaver", "tova", "test", "occupation"),
    ("q1", "In which country is Miralo?", "Quasul", "miralo", "test", "town_country"),
    ("q2", "When was Osk Drafin born?", "1750", "osk", "test", None),
    ("q3", "What is the capital of Quasul?", "Brethos", "quasul", "train", "capital"),
]
METRICS = "success failed reward steps critical_steps context_tokens tool_errors rare_draws latency_seconds"


def _write_data(folder):
    corpus, tasks = folder / "corpus.jsonl", folder / "tasks.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in DOCS.items()))
    keys = ("id", "question", "answer", "gold_doc_ids", "split", "family")
    rows = [dict(zip(keys, (i, q, a, [g], s, f), strict=True)) for i, q, a, g, s, f in TASKS]
    rows = [{k: v for k, v in r.items() if v is not None} for r in rows]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return corpus, tasks


def _harnessrl(*args, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "harnessrl", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _job_checkpoint(run):
    """What a run folder holds after `trainer.save(run / "checkpoints")`."""
    from harnessrl.policy.model import load_model_and_tokenizer
    from harnessrl.train import Trainer

    lm, tokenizer = load_model_and_tokenizer("tiny-base")
    return Trainer(lm, tokenizer, run_dir=run).save(run / "checkpoints")


def test_eval_runs_each_test_task_n_times_and_reports_intervals(tmp_path):
    step = _job_checkpoint(tmp_path / "run")
    corpus, tasks = _write_data(tmp_path)
    (tmp_path / "job.yaml").write_text("agent: {max_turns: 2, max_tokens: 16}\n")
    out = tmp_path / "eval"
    done = _harnessrl("eval", "--env", "search", "--split", "test", "--checkpoint", tmp_path / "run", "--repeats", 2,
                      "--config", tmp_path / "job.yaml", "--corpus", corpus, "--tasks", tasks, "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    report = json.loads((out / "eval.json").read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == report
    assert report["model"] == str(step)
    assert (report["tasks"], report["repeats"], report["episodes"]) == (3, 2, 6)
    metrics = report["metrics"]
    names = set(metrics)
    assert set(METRICS.split()) | {"reward/f_beta", "reward/answer_bonus", "term/f_beta"} <= names
    for name, m in metrics.items():
        assert m["low"] - 1e-9 <= m["mean"] <= m["high"] + 1e-9, name

    lines = (out / "episodes.jsonl").read_text().splitlines()
    episodes = [Episode.from_json(line) for line in lines]
    assert Counter(e.task.id for e in episodes) == {"q0": 2, "q1": 2, "q2": 2}
    for e in episodes:
        assert e.metrics["steps"] == len(e.calls) and 1 <= len(e.calls) <= 2
        # one agent: every call is in the chain
        assert e.metrics["critical_steps"] == len(e.calls)
        largest = max(len(c.prompt_ids) + len(c.completion_ids) for c in e.calls)
        assert e.metrics["context_tokens"] == largest
    # equal repeats: the mean of task means is the mean over episodes
    for name in ("steps", "success", "reward"):
        mean = sum(e.metrics[name] for e in episodes) / len(episodes)
        assert metrics[name]["mean"] == pytest.approx(mean)
    table = (out / "eval.md").read_text()
    assert all(f"| {name} |" in table for name in metrics)
    again = _harnessrl("eval", "--env", "search", "--checkpoint", tmp_path / "run", "--config", tmp_path / "job.yaml",
                       "--corpus", corpus, "--tasks", tasks, "--out", tmp_path / "again",
                       "--baseline", out / "episodes.jsonl")  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    gain = json.loads(again.stdout.strip().splitlines()[-1])["gain_vs_baseline"]
    assert gain["tasks"] == 3 and gain["success_before"] == pytest.approx(metrics["success"]["mean"], abs=1e-4)
    assert gain["ci"][0] - 1e-4 <= gain["success_after"] - gain["success_before"] <= gain["ci"][1] + 1e-4
    classes = Counter(k for e in episodes for k in e.metrics if k.startswith("error/"))
    assert sum(classes.values()) == 6 and report["error_classes"] == {k[6:]: n for k, n in classes.items()}
    assert "Episodes per error class: " in table
    by_class = report["reward_by_error_class"]  # each class's mean reward, recomputed; highest first
    assert set(by_class) == set(report["error_classes"])
    for name, mean in by_class.items():
        rewards = [e.metrics["reward"] for e in episodes if e.metrics.get(f"error/{name}")]
        assert mean == pytest.approx(sum(rewards) / len(rewards))
    assert list(by_class.values()) == sorted(by_class.values(), reverse=True)
    assert "Mean reward per error class: " in table
    by_docs = report["by_gold_docs"]  # success per number of gold documents a task needs
    hops = Counter(len(e.task.data["gold_doc_ids"]) for e in episodes)
    assert {n: g["tasks"] for n, g in by_docs.items()} == {str(n): k // 2 for n, k in hops.items()}
    for n, g in by_docs.items():
        wins = [e.metrics["success"] for e in episodes if len(e.task.data["gold_doc_ids"]) == int(n)]
        assert g["success"]["mean"] == pytest.approx(sum(wins) / len(wins))
    assert "Success by the gold documents a task needs: " in table
    families = report["by_family"]  # success per task family, where the task file names one (q2 does not)
    assert {name: g["tasks"] for name, g in families.items()} == {"occupation": 1, "town_country": 1}
    for name, g in families.items():
        wins = [e.metrics["success"] for e in episodes if e.task.data.get("family") == name]
        assert len(wins) == 2 and g["success"]["mean"] == pytest.approx(sum(wins) / len(wins))
    assert "Success by task family: occupation, 1 tasks" in table
    rare = report["rare_draws"]  # success of episodes without / with a token sampled at p < 1 %
    assert rare["none"]["episodes"] + rare["some"]["episodes"] == 6
    for side, group in (("none", [e for e in episodes if not e.metrics["rare_draws"]]),
                        ("some", [e for e in episodes if e.metrics["rare_draws"]])):  # fmt: skip
        assert rare[side]["episodes"] == len(group)
        if group:
            assert rare[side]["success"] == pytest.approx(sum(e.metrics["success"] for e in group) / len(group))
    assert ("Success of episodes without a token sampled at p < 1 %" in table) == bool(rare["some"]["episodes"])


def test_bad_input_fails_with_exit_2_and_says_why(tmp_path):
    cases = [
        (["--env", "chess", "--checkpoint", "tiny-base"], "unknown; known: search"),
        (["--env", "search", "--checkpoint", tmp_path], "no model folder"),
        (["--env", "search", "--checkpoint", "tiny-base", "--repeats", 0], "repeats"),
    ]
    for args, says in cases:
        done = cli("eval", *args)
        assert done.exit_code == 2 and says in done.stderr, (args, done.output)


def test_bad_flags_are_named_and_a_swarm_or_code_run_is_refused(tmp_path):
    """A flag's error was pydantic's dump (`1 validation error for EvalRequest ... input_value={...}`); a swarm or
    code run was evaluated as if its model were the search agent, exit 0."""
    for args, says in [
        (["--split", "dev"], "error: --split: Input should be 'train' or 'test'"),
        (["--concurrency", 0], "error: --concurrency: Input should be greater than or equal to 1"),
    ]:
        done = cli("eval", "--env", "search", "--checkpoint", "tiny-base", *args)
        assert done.exit_code == 2 and says in done.stderr and "validation error" not in done.stderr, done.stderr
    run = tmp_path / "swarm-run"
    run.mkdir()
    (run / "config.yaml").write_text("swarm: {}\n")
    (run / "phases.json").write_text("{}")
    (tmp_path / "code.yaml").write_text("code: {}\n")
    for args, job in [
        (["--checkpoint", run], "swarm"),
        (["--checkpoint", "tiny-base", "--config", tmp_path / "code.yaml"], "code"),
    ]:
        done = cli("eval", "--env", "search", *args, "--out", tmp_path / "eval")
        assert done.exit_code == 2, done.output
        assert f"--env search: the job config sets {job}: (the {job} job)" in done.stderr
    assert not (tmp_path / "eval").exists()


def test_checkpoint_resolution(tmp_path):
    step = tmp_path / "run" / "checkpoints" / "step-000007"
    step.mkdir(parents=True)
    (step / "config.json").write_text("{}")
    (step / "trainer_state.pt").write_bytes(b"")  # a complete checkpoint
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step-000007")
    for given in (tmp_path / "run", tmp_path / "run" / "checkpoints", step):
        assert resolve_checkpoint(str(given)) == str(step)
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step-000009")  # killed before step 9 was whole
    assert resolve_checkpoint(str(tmp_path / "run")) == str(step)
    # a job's kept checkpoint (best/) wins over its newest one, as an SFT run's final weights do
    (tmp_path / "run" / "best").mkdir()
    (tmp_path / "run" / "best" / "config.json").write_text("{}")
    assert resolve_checkpoint(str(tmp_path / "run")) == str(tmp_path / "run" / "best")
    assert resolve_checkpoint(str(tmp_path / "run" / "checkpoints")) == str(step)
    (tmp_path / "run" / "model").mkdir()
    (tmp_path / "run" / "model" / "config.json").write_text("{}")
    assert resolve_checkpoint(str(tmp_path / "run")) == str(tmp_path / "run" / "model")
    assert resolve_checkpoint("tiny-base") == "tiny-base"
    with pytest.raises(CheckpointError, match="no such folder"):
        resolve_checkpoint(str(tmp_path / "nowhere"))


def _step(root, number):
    """A complete checkpoint under `root`, named by `root/latest`."""
    step = root / f"step-{number:06d}"
    step.mkdir(parents=True)
    (step / "config.json").write_text("{}")
    (step / "trainer_state.pt").write_bytes(b"")
    (root / "latest").write_text(step.name)
    return step


def test_checkpoint_resolution_of_a_job_that_ended_on_sft_or_was_killed_replacing_best(tmp_path):
    run = tmp_path / "run"
    sft = _step(run / "sft" / "checkpoints", 10)
    assert resolve_checkpoint(str(run)) == str(sft)  # rl.updates 0 and no validation: the SFT weights
    rl = _step(run / "checkpoints", 2)
    assert resolve_checkpoint(str(run)) == str(rl)
    (run / ".best.old").mkdir()  # killed after moving best/ aside, before putting the new one in place
    (run / ".best.old" / "config.json").write_text("{}")
    assert resolve_checkpoint(str(run)) == str(run / ".best.old")


def _call(agent, start, end, prompt=(1,), completion=(2,), **kw):
    return Call(agent=agent, prompt_ids=list(prompt), completion_ids=list(completion), sampled_logprobs=[0.0] * len(completion),
                policy_version=0, started_at=start, ended_at=end, **kw)  # fmt: skip


def test_critical_steps_count_parallel_sub_agents_once():
    single = [_call("main", t, t + 0.5) for t in range(4)]
    assert critical_steps(single) == 4
    # stage 1: main, then sub-agents a (3 calls) and b (2 calls) in parallel; stage 2: main, then c (1 call); main answers
    swarm = [
        _call("main", 0.0, 1.0),
        _call("sub", 1.1, 2.0), _call("sub", 1.1, 2.5), _call("sub", 2.1, 3.0), _call("sub", 2.6, 3.5), _call("sub", 3.1, 4.0),
        _call("main", 4.1, 5.0), _call("sub-c", 5.1, 6.0), _call("main", 6.1, 7.0),
    ]  # fmt: skip
    # sum over stages of S_main + max_i S_sub,i
    assert critical_steps(swarm) == (1 + 3) + (1 + 1) + 1
    assert critical_steps([]) == 0


def test_tool_errors_count_malformed_calls_and_error_observations():
    def decode(ids):  # one character per id
        return "".join(map(chr, ids))

    def text(s):
        return [ord(ch) for ch in s]

    first = _call("main", 0, 1, prompt=text("sys\nq\n"), completion=text("call"))
    history = first.prompt_ids + first.completion_ids
    second = _call("main", 2, 3, prompt=history + text("\nerror: bad args\nok\n"), completion=text("x"), extends_call=0)  # fmt: skip
    third = _call("main", 4, 5, prompt=history + text("\nerror: bad args\n(pruned)\nerror: no doc\n"), completion=text("y"), tool_call_error="bad JSON")  # fmt: skip
    # an observation after an extension, one after a history edit, one malformed call
    assert tool_errors([first, second, third], decode) == 1 + 1 + 1
    said = _call("main", 2, 3, prompt=history + text("\nok\n"), completion=text("\nerror: mine"))  # fmt: skip
    after = _call("main", 4, 5, prompt=said.prompt_ids + said.completion_ids + text("\nok\n"), completion=text("z"))  # fmt: skip
    # the model's own words are not observations
    assert tool_errors([first, said, after], decode) == 0


def test_rare_draws_count_the_policys_tail_samples_only():
    sampled = _call("main", 0, 1, completion=(5, 6, 7, 8))
    sampled.sampled_logprobs = [-0.01, -4.7, -4.5, -9.0]  # p = 0.99, 0.009, 0.011, 0.0001
    frozen = _call("sub", 0, 1, completion=(5,), trainable=False)
    frozen.sampled_logprobs = [-9.0]  # a frozen sub-agent's draw is not the policy's
    assert rare_draws([sampled, frozen]) == 2 and rare_draws([]) == 0
    task = Task(id="t", prompt="q")
    episodes = [
        Episode(task=task, metrics={"success": s, "rare_draws": r}) for s, r in [(1, 0), (0, 0), (0, 3), (1, 1)]
    ]
    assert by_rare_draws(episodes) == {"none": {"episodes": 2, "success": 0.5}, "some": {"episodes": 2, "success": 0.5}}
    assert by_rare_draws(episodes[:2])["some"] == {"episodes": 0, "success": None}


def test_bootstrap_interval_by_hand_and_tasks_resampled_whole():
    assert bootstrap_ci([0.25]) == (0.25, 0.25)
    # resampled means 0, .5, 1 with chances 1/4, 1/2, 1/4
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    # normal approximation: 0.5 -/+ 1.96 * 0.5 / sqrt(20) = 0.28, 0.72
    low, high = bootstrap_ci([0.0] * 10 + [1.0] * 10)
    assert 0.25 < low < 0.5 < high < 0.75

    def task(tid, *values):
        return [Episode(task=Task(id=tid), metrics={"success": v}) for v in values]

    # task means .5 and 1: a resample draws whole tasks, never single episodes
    summary = summarize(task("a", 1.0, 0.0) + task("b", 1.0, 1.0))
    assert summary["success"] == {"mean": 0.75, "low": 0.5, "high": 1.0}


def test_permutation_p_by_hand():
    # 4 tasks from 2 of 2 to 0 of 2: each task's two successes both land before in 1 of 6 relabellings
    assert permutation_p([[1, 1]] * 4, [[0, 0]] * 4, resamples=20000) == pytest.approx(6**-4, abs=4e-4)
    assert permutation_p([[1, 1]] * 4, [[1, 1]] * 4) == 1.0  # nothing changed: every relabelling ties
    # 4 tasks from 2 of 2 to 1 of 2: the failure lands after in half the relabellings, each task alike
    assert permutation_p([[1, 1]] * 4, [[1, 0]] * 4, resamples=20000) == pytest.approx(2**-4, abs=0.01)
    assert permutation_p([[0, 0]] * 4, [[1, 1]] * 4) == 1.0  # a rise is no fall


async def test_a_failed_episode_scores_the_failure_reward(policy):
    from harnessrl.eval.evaluate import EvalEnv, run_episodes
    from harnessrl.gateway import GatewayClient, create_app
    from harnessrl.rewards import Reward, Term
    from harnessrl.rollout import RolloutConfig
    from harnessrl.types import Outcome

    async def harness(task, llm):
        if task.id == "bad":
            raise RuntimeError("tool crashed")
        return Outcome(answer="ok", success=True)

    env = EvalEnv(harness, [Task(id="good"), Task(id="bad")], Reward([Term("one", lambda e: 1.0)]))
    gateway = GatewayClient("eval-admin-key", app=create_app(policy, "eval-admin-key"))
    try:
        rollout = RolloutConfig(concurrency=2, failure_reward=-0.5)
        episodes = await run_episodes(gateway, env, 2, rollout)
    finally:
        await gateway.aclose()
    assert [e.task.id for e in episodes] == ["good", "good", "bad", "bad"]
    assert all(e.metrics["latency_seconds"] >= 0 for e in episodes)
    good, bad = (episode_metrics(e, policy.decode) for e in (episodes[0], episodes[2]))
    assert good == {"success": 1.0, "failed": 0.0, "reward": 1.0, "reward/one": 1.0, "term/one": 1.0, "steps": 0.0,
                    "critical_steps": 0.0, "context_tokens": 0.0, "tool_errors": 0.0, "rare_draws": 0.0}  # fmt: skip
    assert "tool crashed" in episodes[2].failure_reason
    assert bad["failed"] == 1.0 and bad["success"] == 0.0
    assert bad["reward"] == bad["reward/failure"] == -0.5


def test_the_gain_against_a_baseline_pairs_the_tasks_both_evaluated():
    def episode(task: str, success: bool) -> Episode:
        return Episode(task=Task(id=task), status="finished", outcome=Outcome(success=success))

    before = [episode("a", False), episode("a", True), episode("b", True), episode("gone", True)]
    after = [episode("a", True), episode("b", True), episode("new", False)]
    gain = paired_gain(before, after)  # a: 0.5 -> 1.0, b: 1.0 -> 1.0; "gone" and "new" left out
    assert (gain["tasks"], gain["success_before"], gain["success_after"]) == (2, 0.75, 1.0)
    assert gain["ci"][0] == 0.0 and gain["ci"][1] == 0.5
    with pytest.raises(ValueError, match="share no task"):
        paired_gain(before, [episode("new", True)])
    with pytest.raises(ValueError, match="share no task"):  # was [nan, nan] with numpy's warnings
        gain_ci(before, [episode("new", True)])
