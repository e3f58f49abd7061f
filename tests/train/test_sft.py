"""`harnessrl sft` end to end, including a SIGKILL mid-run and an exact resume."""

import json
import signal
import subprocess
import sys
import time

import pytest
from transformers import AutoModelForCausalLM

from harnessrl.policy.tiny import build_tokenizer
from harnessrl.train.sft import TraceLineError, demonstration, read_episodes, run_sft
from harnessrl.types import Task
from tests.conftest import cli

WORDS = ["apple", "river", "stone", "cloud", "lamp", "seven", "green", "table"]


def write_demos(path, n: int = 48) -> None:
    """Demonstrations of 'Repeat: W' -> 'W', rendered with the tiny chat template."""
    tok = build_tokenizer()
    with open(path, "w") as f:
        for i in range(n):
            word = WORDS[i % len(WORDS)]
            episode = demonstration(
                tok, [{"role": "user", "content": f"Repeat: {word}"}], word, task=Task(id=f"demo-{i}")
            )
            f.write(episode.to_json() + "\n")


def _steps(run) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_built_demonstration_is_marked_one_so_rl_never_takes_its_ratio():
    """It was a sampled call at T = 1 with logprobs 0: in an RL group its ratio was about 0.0005, all clipped."""
    episode = demonstration(build_tokenizer(), [{"role": "user", "content": "Repeat: lamp"}], "lamp")
    assert episode.demonstrated and not episode.calls[0].sampled


def test_sft_learns_the_demonstrations(tmp_path):
    write_demos(tmp_path / "demos.jsonl")
    run_sft(tmp_path / "demos.jsonl", tmp_path / "run", epochs=6, batch_episodes=8, save_every=100)
    losses = [json.loads(line)["loss/sft"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert _steps(tmp_path / "run") == list(range(1, 37))
    assert losses[-1] < 0.5 * losses[0]
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model").config.model_type == "qwen2"
    with pytest.raises(FileExistsError, match="--resume"):
        run_sft(tmp_path / "demos.jsonl", tmp_path / "run")


def test_a_bad_trace_line_names_its_line_and_field(tmp_path):
    write_demos(tmp_path / "demos.jsonl", n=3)
    lines = (tmp_path / "demos.jsonl").read_text().splitlines()
    (tmp_path / "cut.jsonl").write_text(lines[0] + "\n" + lines[1][:40] + "\n")
    with pytest.raises(TraceLineError, match=r"cut.jsonl: line 2: "):
        read_episodes(tmp_path / "cut.jsonl")
    bad = json.loads(lines[0])
    del bad["calls"][0]["prompt_ids"]
    (tmp_path / "missing.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(TraceLineError, match=r"line 1: calls.0.prompt_ids: Field required"):
        read_episodes(tmp_path / "missing.jsonl")
    done = cli("sft", "--data", tmp_path / "cut.jsonl", "--out", tmp_path / "r")
    assert done.exit_code == 2 and "line 2" in done.stderr
    (tmp_path / "latin1.jsonl").write_bytes(
        lines[0].encode() + b"\n" + lines[1].replace("demo-1", "d\xe9mo-1").encode("latin-1")
    )
    done = cli("sft", "--data", tmp_path / "latin1.jsonl", "--out", tmp_path / "r")
    assert done.exit_code == 2 and "latin1.jsonl: line 2: not UTF-8" in done.stderr, done.output
    done = cli("sft", "--data", tmp_path, "--out", tmp_path / "r")  # a folder: an OSError, said, not a traceback
    assert done.exit_code == 2 and str(tmp_path) in done.stderr, done.output


def test_demonstrations_sft_cannot_learn_from_are_refused_before_any_step(tmp_path):
    write_demos(tmp_path / "demos.jsonl", n=2)
    first, second = (json.loads(line) for line in (tmp_path / "demos.jsonl").read_text().splitlines())
    frozen = [{**e, "calls": [{**c, "trainable": False} for c in e["calls"]]} for e in (first, second)]
    (tmp_path / "frozen.jsonl").write_text("".join(json.dumps(e) + "\n" for e in frozen))
    with pytest.raises(ValueError, match="frozen.jsonl: no episode has a trainable call"):
        run_sft(tmp_path / "frozen.jsonl", tmp_path / "a")
    second["calls"][0]["completion_ids"][0] = 1_000_000  # another tokenizer's id
    (tmp_path / "foreign.jsonl").write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    with pytest.raises(ValueError, match=r"foreign.jsonl: episode 2 \(\w+\), call 0: token id 1000000 is outside"):
        run_sft(tmp_path / "foreign.jsonl", tmp_path / "b")
    assert not (tmp_path / "a" / "metrics.jsonl").exists() and not (tmp_path / "b" / "metrics.jsonl").exists()


def test_sigkill_mid_run_then_resume_continues_without_gap_or_repeat(tmp_path):
    write_demos(tmp_path / "demos.jsonl", n=64)
    args = ["--data", str(tmp_path / "demos.jsonl"), "--epochs", "4", "--batch-episodes", "4", "--save-every", "5"]
    args += ["--precision", "fp32"]  # bf16 kernels may reduce in another order from one run to the next
    command = [sys.executable, "-m", "harnessrl", "sft", *args]
    straight = subprocess.run(
        [*command, "--out", str(tmp_path / "straight")], capture_output=True, text=True, timeout=600
    )
    assert straight.returncode == 0, straight.stderr

    run = tmp_path / "killed"
    victim = subprocess.Popen([*command, "--out", str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not ((run / "checkpoints" / "latest").exists() and len(_lines(run)) >= 13):
        assert victim.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert 13 <= len(_lines(run)) < 64, "killed mid-run"

    resumed = subprocess.run([*command, "--out", str(run), "--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert _steps(run) == list(range(1, 65))  # no gap, no repeat
    final = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    reference = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    # Two fp32 runs of the same code can differ by ~1e-6 on some CPUs (MKL picks kernels by memory alignment),
    # even before the kill; a resume that lost optimizer state or repeated a batch is off by far more.
    assert [m["loss/sft"] for m in final] == pytest.approx([m["loss/sft"] for m in reference], rel=1e-4)
    assert AutoModelForCausalLM.from_pretrained(
        run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    )
    assert AutoModelForCausalLM.from_pretrained(run / "model")


def _lines(run) -> list[str]:
    path = run / "metrics.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def test_demo_nll_falls_once_a_model_learnt_the_demonstrations(tmp_path):
    import importlib.util
    from pathlib import Path

    write_demos(tmp_path / "demos.jsonl", n=8)
    run_sft(tmp_path / "demos.jsonl", tmp_path / "run", epochs=8, batch_episodes=8, save_every=100)
    script = Path(__file__).resolve().parents[2] / "scripts" / "demo_nll.py"
    spec = importlib.util.spec_from_file_location("demo_nll", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    learnt = str(tmp_path / "run" / "model")
    nll = module.main([str(tmp_path / "demos.jsonl"), "tiny", learnt])
    assert 0 < nll[learnt] < nll["tiny"] - 1.0  # nats a token
