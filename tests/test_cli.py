"""End to end, as a new user would: `harnessrl serve` in one process, an agent in another."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import cli

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_and_an_example_agent_over_http(tmp_path):
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "harnessrl", "serve", "--model", "tiny", "--port", str(port), "--admin-key", "cli-admin-key",
         "--frozen", "scout=tiny-base", "--frozen-cache", "64", "--prefix-cache", "4096"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        out = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "weather_agent.py"), "--base-url", f"http://127.0.0.1:{port}", "--admin-key", "cli-admin-key"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        assert summary["calls"] == 5 and summary["token_exact"] is True
        assert summary["prompt_tokens"] == sorted(summary["prompt_tokens"])
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer cli-admin-key"})
        assert [m["id"] for m in models.json()["data"]] == ["tiny", "scout"]
        # --prefix-cache: a next turn prefills from the KV its previous turn left, and says how much it reused
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=60)
        key = api.post("/episodes", headers=models.request.headers, json={}).json()["api_key"]
        system = "You answer weather questions for travellers: the city, the sky, the temperature, an umbrella or not."
        messages, usage = [{"role": "system", "content": system}, {"role": "user", "content": "Weather in Paris?"}], []
        for _ in range(2):
            body = {"model": "tiny", "messages": messages, "max_tokens": 8}
            reply = api.post("/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}).json()
            messages += [reply["choices"][0]["message"], {"role": "user", "content": "And tomorrow?"}]
            usage.append(reply["usage"])
        first, second = usage
        assert first["prompt_tokens"] <= second["prompt_tokens_details"]["cached_tokens"] < second["prompt_tokens"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_save_model_writes_a_loadable_folder_and_bad_models_fail_clearly(tmp_path):
    run = [sys.executable, "-m", "harnessrl"]
    done = subprocess.run([*run, "save-model", str(tmp_path / "tiny")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "tiny").iterdir()}
    bad = cli("serve", "--model", tmp_path / "missing")
    assert bad.exit_code == 2 and "smollm2-135m-instruct, a .gguf file or a folder with a config.json" in bad.stderr
    both = cli("serve", "--vllm-url", "http://127.0.0.1:9/v1", "--prefix-cache", "4096")
    assert both.exit_code == 2 and "--prefix-cache" in both.stderr and "enable-prefix-caching" in both.stderr


def test_sandbox_prints_the_guard_line_last(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "harnessrl", "sandbox", *args], capture_output=True, text=True)

    done = run("--workspace", str(tmp_path), "--", sys.executable, "-c", "print('inside'); open('made', 'w')")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "inside" and (tmp_path / "made").is_file()
    last = json.loads(lines[-1])
    assert (last["exit_code"], last["timed_out"], last["survivors"]) == (0, False, 0)
    assert set(last["guards"]) >= {"network", "memory", "processes", "writes"}
    slow = run("--workspace", str(tmp_path), "--timeout", "1", "--", "sleep", "30")
    assert slow.returncode == 1 and json.loads(slow.stdout.splitlines()[-1])["timed_out"] is True
    missing = cli("sandbox", "--workspace", tmp_path / "nope", "--", "true")
    assert missing.exit_code == 2 and "nope" in missing.stderr
    write = "open('big', 'wb').write(bytes(3 << 20))"
    capped = run("--workspace", str(tmp_path), "--workspace-mb", "2", "--", sys.executable, "-c", write)
    assert json.loads(capped.stdout.splitlines()[-1])["disk_full"] is True and not (tmp_path / "big").exists()
    assert "over the 2 MiB" in capped.stderr and (tmp_path / "made").is_file()  # older files stay
    small = run("--workspace", str(tmp_path), "--file-mb", "1", "--", sys.executable, "-c", write)
    assert small.returncode == 1 and (tmp_path / "big").stat().st_size <= 1 << 20
    unended = run("--workspace", str(tmp_path), "--", "printf", "abc")  # output without a final newline
    assert unended.stdout.splitlines()[0] == "abc" and json.loads(unended.stdout.splitlines()[-1])["exit_code"] == 0
    for flag, value in (("--cpu-seconds", "-1"), ("--processes", "0"), ("--memory-mb", "-1"), ("--timeout", "nan")):
        off = cli("sandbox", "--workspace", tmp_path, flag, value, "--", "true")  # turned its guard off, or ran nothing
        assert off.exit_code == 2 and flag.removeprefix("--").split("-")[0] in off.stderr, (flag, off.stderr)


def test_make_corpus_writes_both_files_and_never_overwrites_without_force(tmp_path):
    done = cli("make-corpus", tmp_path / "v", "--generator", "voyages")
    assert done.exit_code == 0, done.output
    tasks = [json.loads(line) for line in (tmp_path / "v" / "tasks.jsonl").read_text().splitlines()]
    documents = {json.loads(line)["id"] for line in (tmp_path / "v" / "corpus.jsonl").read_text().splitlines()}
    assert {t["split"] for t in tasks} == {"train", "test"} and all(set(t["gold_doc_ids"]) <= documents for t in tasks)
    assert f"{len(documents)} documents" in done.output
    (tmp_path / "v" / "corpus.jsonl").write_text('{"id": "mine", "text": "a user\'s own document"}\n')
    refused = cli("make-corpus", tmp_path / "v")
    assert refused.exit_code == 2 and "already holds corpus.jsonl and tasks.jsonl" in refused.stderr
    assert "mine" in (tmp_path / "v" / "corpus.jsonl").read_text()
    assert cli("make-corpus", tmp_path / "v", "--force").exit_code == 0
    assert "mine" not in (tmp_path / "v" / "corpus.jsonl").read_text()
    unknown = cli("make-corpus", tmp_path / "w", "--generator", "ships")
    assert unknown.exit_code == 2 and "'ships' is not one of people, voyages" in unknown.stderr


def test_make_corpus_writes_the_main_jobs_corpus_with_its_people(tmp_path):
    from harnessrl.envs.search import synthetic

    done = cli("make-corpus", tmp_path / "p", "--people", "340")
    assert done.exit_code == 0, done.output
    docs, tasks = synthetic(0, people=340)  # what `harnessrl train` builds by default (data.synthetic_people)
    written = [json.loads(line) for line in (tmp_path / "p" / "corpus.jsonl").read_text().splitlines()]
    assert [d["id"] for d in written] == [d.id for d in docs] and "256 train / 84 test" in done.output
    other = cli("make-corpus", tmp_path / "q", "--generator", "voyages", "--people", "10")
    assert other.exit_code == 2 and "--people: the voyages generator has no people" in other.stderr


def test_serve_on_port_0_prints_the_port_it_got(tmp_path):
    """It printed port 0 (the one asked for), so a user could not find the gateway."""
    log = tmp_path / "serve.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "harnessrl", "serve", "--model", "tiny", "--port", "0", "--admin-key", "cli-admin-key"],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "serving " not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        port = int(log.read_text().split("serving tiny on http://127.0.0.1:")[1].split("/")[0])
        assert port > 0, log.read_text()
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
                break
            except httpx.TransportError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_serve_refuses_counts_ports_and_log_levels_it_cannot_use_before_loading_a_model():
    # with a valid value each would load the model and then hang or fail inside uvicorn; the short --admin-key
    # is refused before any model loads, so a missing check shows as that error instead of a hang
    for args, named in [
        (("--max-batch", "0"), "--max-batch"),
        (("--max-batch", "-3"), "--max-batch"),
        (("--port", "70000"), "--port"),
        (("--port", "-1"), "--port"),
        (("--log-level", "bogus"), "--log-level"),
    ]:
        refused = cli("serve", *args, "--admin-key", "short")
        assert refused.exit_code == 2 and named in refused.stderr, (args, refused.stderr)


def test_cli_inputs_that_are_folders_files_or_bad_yaml_fail_naming_them(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("mine\n")
    corpus = cli("make-corpus", taken)
    assert corpus.exit_code == 2 and str(taken) in corpus.stderr and "not a folder" in corpus.stderr
    saved = cli("save-model", taken)
    assert saved.exit_code == 2 and str(taken) in saved.stderr and taken.read_text() == "mine\n"
    decisions = cli("probe", "--decisions", tmp_path)
    assert decisions.exit_code == 2 and "--decisions" in decisions.stderr and str(tmp_path) in decisions.stderr
    bad = tmp_path / "judge.yaml"
    bad.write_text("base_url: http://127.0.0.1:9/v1\nrubrik: typo\n")
    (tmp_path / "episodes.jsonl").write_text("")
    judged = cli("judge-calibrate", "--episodes", tmp_path / "episodes.jsonl", "--judge", bad)
    assert judged.exit_code == 2 and f"{bad}: rubrik:" in judged.stderr, judged.stderr
    assert cli("make-corpus", tmp_path / "c").exit_code == 0
    generated = cli("tasks", "--corpus", tmp_path / "c" / "corpus.jsonl", "--generator", bad)
    assert generated.exit_code == 2 and f"{bad}: rubrik:" in generated.stderr, generated.stderr
    audited = cli("tasks", "--corpus", tmp_path / "c" / "corpus.jsonl", "--audit", tmp_path / "c" / "tasks.jsonl",
                  "--judge", bad)  # fmt: skip
    assert audited.exit_code == 2 and f"{bad}: rubrik:" in audited.stderr, audited.stderr


def test_errors_print_paths_with_brackets_as_they_are(tmp_path):
    """Messages are not rich markup: a path like runs[exp1] was printed as runs (its tag eaten) and one holding
    [/x] made the error's own printing raise."""
    for command, path in [("inspect", tmp_path / "b[/x]" / "e.jsonl"), ("report", tmp_path / "runs[bold]")]:
        done = cli(command, path)
        assert done.exit_code == 2 and f"error: {path}:" in done.stderr, done.stderr


def test_flags_that_would_be_ignored_are_refused(tmp_path):
    episodes = tmp_path / "demos.jsonl"
    episodes.write_text("")
    for args, named in [
        (("probe", "--decisions", episodes, "--items", "5"), "--items: for the skill probes"),
        (("probe", "--record-grid", "--context", "0,512"), "two grids"),
        (("report", tmp_path, "--registry", tmp_path), "give no RUN folder"),
        (("train", "--resume", tmp_path, "--out", tmp_path / "b"), "--out"),  # it went on in the --resume folder
        (("probe", "--context", "0,-5"), "--context"),  # before any model loads (it probed with no context at -5)
        (("probe", "--context", "0,x"), "--context"),
    ]:
        done = cli(*args)
        assert done.exit_code == 2 and named in done.stderr, done.stderr


def test_eval_takes_a_run_config_only_from_a_run_folder(tmp_path):
    from harnessrl.cli import _run_folder

    (tmp_path / "config.yaml").write_text("learning_rate: 0.1\n")  # a project's own, not a job's
    (tmp_path / "mymodel").mkdir()
    assert _run_folder(str(tmp_path / "mymodel")) is None
    (tmp_path / "phases.json").write_text("{}")
    assert _run_folder(str(tmp_path / "mymodel")) == tmp_path.resolve()


def test_sft_flags_are_named_and_save_model_never_replaces_a_model(tmp_path):
    """A bad --schedule printed pydantic's dump for TrainConfig; save-model wrote tiny's weights over a folder's
    model (a run's best/) without a word."""
    (tmp_path / "demos.jsonl").write_text("")
    for args, says in [
        (("--schedule", "cosin"), "error: --schedule: Input should be 'constant', 'linear', 'cosine' or 'wsd'"),
        (("--lr", "0"), "error: --lr: Input should be greater than 0"),
    ]:
        done = cli("sft", "--data", tmp_path / "demos.jsonl", "--out", tmp_path / "sft", *args)
        assert done.exit_code == 2 and says in done.stderr and "validation error" not in done.stderr, done.stderr
    best = tmp_path / "run" / "best"
    best.mkdir(parents=True)
    (best / "config.json").write_text('{"trained": true}')
    (best / "model.safetensors").write_bytes(b"trained weights")
    done = cli("save-model", best)
    assert done.exit_code == 2 and f"{best} already holds a model (config.json)" in done.stderr, done.output
    assert (best / "model.safetensors").read_bytes() == b"trained weights"
