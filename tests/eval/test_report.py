"""`harnessrl report` on run folders written by real tiny trainer runs, checked in headless Chromium.

Chromium is Debian's package (scripts/test.sh installs it), driven over its DevTools protocol on
127.0.0.1: the page is loaded, then every <img> must have decoded (naturalWidth > 0).
"""

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner
from websockets.sync.client import connect

from harnessrl.cli import app
from harnessrl.eval.plots import trailing_mean
from harnessrl.policy import Policy
from harnessrl.rewards import Term, anneal_to_zero
from harnessrl.rewards.parl import SwarmAlarms, parl_reward, swarm_metrics
from harnessrl.train import TrainConfig, Trainer
from harnessrl.train.sft import demonstration
from harnessrl.types import Outcome
from tests.train.helpers import sampled_groups

SUMMARY = {  # the keys the main job writes
    "heldout_tasks": 4,
    "heldout_success_before": 0.25,
    "heldout_success_after": 0.5,
    "heldout_success_greedy_before": 0.25,
    "heldout_success_greedy_after": 0.75,
    "rl_updates": 3,
    "heldout_gain_ci": [-0.0795, 0.20451],
    "heldout_alarms": ["birth_year_falling", "greedy_falling"],
    "training_trend": {"alarms": []},
    "phase_seconds": {"sft": 1.5, "rl": 2.0},
}
# every panel but policy/kl, which neither run logs
PANELS = {"heldout", "success", "reward", "hacking", "entropy", "clip", "ratios"}
PANELS |= {
    "staleness",
    "logprob_gap",
    "loss",
    "sft_loss",
    "sft_names",
    "swarm",
    "swarm_steps",
    "swarm_lambdas",
    "alarms",
    "validation",
}


def _trainer(policy: Policy, folder: Path, **config) -> Trainer:
    return Trainer(policy.model, policy.tokenizer, TrainConfig(lr=1e-3, **config), folder, policy)


def _run_a(folder: Path) -> None:
    """As the main job lays it out: one SFT update logged in sft/, three on-policy RL
    updates (some episodes flagged) in metrics.jsonl, validation.jsonl and a summary.json."""
    policy = Policy.load("tiny")
    try:
        demos = [e for g in sampled_groups(policy, seed=9) for e in g]
        call = '<tool_call>{"name": "get_tide", "arguments": {"place": "Olmar"}}</tool_call>'
        demos.append(demonstration(policy.tokenizer, [{"role": "user", "content": "Tide at Olmar?"}], call))
        _trainer(policy, folder / "sft").sft_step(demos)
        trainer = _trainer(policy, folder)
        reward, alarms = parl_reward(Term("perf", lambda e: 0.0), anneal_to_zero(0.1, 3)), SwarmAlarms()
        for update in range(3):
            groups = sampled_groups(policy, seed=update)
            for episode in groups[0][: update + 1]:
                episode.reward.flags.append("repetition")
            for i, episode in enumerate(e for g in groups for e in g):  # as a swarm harness reports its sub-agents
                episode.outcome = Outcome(info={"swarm": {"assigned": i % 3, "finished": i % 2}})
            swarm = swarm_metrics([e for g in groups for e in g], reward, update)
            trainer.rl_step(groups, extra=swarm | alarms.update(swarm))
    finally:
        policy.close()
    (folder / "summary.json").write_text(json.dumps(SUMMARY))
    validated = [{"update": 0, "success": 0.25, "episodes": 4}, {"update": 3, "success": 0.5, "episodes": 4}]
    (folder / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in validated))


def _run_b(folder: Path) -> None:
    """Three RL updates on batches all sampled up front (stale), decoupled PPO; no summary."""
    policy = Policy.load("tiny")
    try:
        batches = [sampled_groups(policy, seed=10 + u) for u in range(3)]
        trainer = _trainer(policy, folder, off_policy="decoupled")
        for groups in batches:
            trainer.rl_step(groups)
    finally:
        policy.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("report")
    a, b = root / "run-a", root / "run-b"
    _run_a(a)
    _run_b(b)
    return a, b


def test_two_runs_make_one_page_whose_images_all_load_in_chromium(runs, tmp_path):
    a, b = runs
    result = CliRunner().invoke(app, ["report", str(a), str(b)])
    assert result.exit_code == 0, result.output
    page = a / "report.html"
    assert result.stdout.strip().splitlines()[-1] == str(page)
    assert {p.stem for p in (a / "report").glob("*.png")} == PANELS
    text = page.read_text()
    assert "policy/kl" in text.split("<h2>Not in metrics.jsonl</h2>")[1]
    assert f"No summary.json in <code>{b}</code>" in text
    cells = "<td>{}</td><td>{}</td><td>{}</td>"
    assert cells.format("heldout_success_greedy_after", 0.75, "&mdash;") in text
    assert cells.format("phase_seconds.rl", 2, "&mdash;") in text
    assert cells.format("heldout_gain_ci", "[-0.0795, 0.2045]", "&mdash;") in text
    assert cells.format("heldout_alarms", "birth_year_falling, greedy_falling", "&mdash;") in text
    assert cells.format("training_trend.alarms", "none", "&mdash;") in text
    assert cells.format("RL updates", 3, 3) in text
    assert cells.format("SFT updates", 1, 0) in text  # a's from sft/metrics.jsonl
    assert "policy/is_weight_mean" in text and "hacking/repetition" in text  # b's, a's

    loaded = images_in_chromium(page, tmp_path / "profile")
    assert loaded["href"] == page.as_uri()
    assert loaded["title"] == "harnessrl report: run-a vs run-b"
    assert sorted(i["src"] for i in loaded["images"]) == sorted(f"report/{name}.png" for name in PANELS)
    assert all(i["complete"] and i["width"] > 0 for i in loaded["images"]), loaded

    # the check can fail: a missing PNG is an image of width 0
    (a / "report" / "staleness.png").unlink()
    broken = images_in_chromium(page, tmp_path / "profile2")
    zero = [i["src"] for i in broken["images"] if i["width"] == 0]
    assert zero == ["report/staleness.png"]


def test_one_run_with_out_elsewhere_refers_to_images_beside_the_page(runs, tmp_path):
    out = tmp_path / "pages" / "mine.html"
    out.parent.mkdir()
    result = CliRunner().invoke(app, ["report", str(runs[1]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text, images = out.read_text(), out.parent / "mine"
    assert '<img src="mine/staleness.png"' in text
    assert (images / "staleness.png").is_file()
    assert not (images / "heldout.png").exists()  # b has no summary.json
    assert not (images / "sft_loss.png").exists()
    assert "loss/sft" in text.split("Not in metrics.jsonl")[1]
    assert "swarm" not in text and "alarm" not in text  # a feature's panels are not "missing" where it is unused
    # b's updates were sampled up front: the staleness panel plots 0, 1, 2
    metrics = (runs[1] / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["policy/staleness"] for line in metrics] == [0, 1, 2]


def test_bad_run_folders_fail_with_exit_2_naming_the_file_and_line(runs, tmp_path):
    def report(*folders: Path):
        result = CliRunner().invoke(app, ["report", *map(str, folders)])
        assert result.exit_code == 2, result.output
        return result.stderr

    assert f"{tmp_path / 'nope'}: no such run folder" in report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    missing = tmp_path / "empty" / "metrics.jsonl"
    assert f"{missing}: missing" in report(runs[0], tmp_path / "empty")
    cut = tmp_path / "cut"
    cut.mkdir()
    lines = (runs[0] / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("\n".join([lines[0], lines[2][:40], lines[1]]) + "\n")
    assert f"{cut / 'metrics.jsonl'}: line 2: not JSON" in report(cut)
    assert not (cut / "report.html").exists()
    # a value the page counts or plots by, or a summary's bar groups, of the wrong shape
    bad = {
        "validation.jsonl": ('{"update": 0, "success": 0.5}\n{"success": 0.5}\n', "line 2: 'update' missing"),
        "summary.json": (
            '{"heldout_success_before": 0.1, "heldout_by_gold_docs": [1, 2]}',
            "'heldout_by_gold_docs' is [1, 2]",
        ),
        "metrics.jsonl": (lines[0] + '\n{"perf/skipped_update": null}\n', "line 2: 'perf/skipped_update' is null"),
    }
    for name, (text, says) in bad.items():
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / "metrics.jsonl").write_text(lines[0] + "\n")
        (folder / name).write_text(text)
        assert f"{folder / name}: {says}" in report(folder)


def test_a_last_line_cut_short_is_skipped_as_the_job_drops_it(runs, tmp_path):
    """A line being appended (a live run) or cut by a kill: no newline yet. The job drops it too."""
    lines = (runs[0] / "metrics.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "metrics.jsonl").write_text("".join(lines[:2]) + lines[2][:40])
    (tmp_path / "validation.jsonl").write_text('{"update": 0, "success": 0.25}\n{"update": 3, "succ')
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "report.html").read_text()
    assert "<td>RL updates</td><td>2</td>" in text and (tmp_path / "report" / "validation.png").is_file()


def test_a_file_that_is_not_utf8_or_one_run_given_twice_fails_with_exit_2(tmp_path):
    """A damaged byte made `report` end in a UnicodeDecodeError traceback; the same folder twice drew one run's
    curves under a legend of two."""
    line = json.dumps({"rollout/groups": 2, "reward/mean": 0.5}) + "\n"
    (tmp_path / "metrics.jsonl").write_bytes(line.encode() + b'{"reward/mean": "\xff"}\n' + line.encode())
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and f"{tmp_path / 'metrics.jsonl'}: line 2: not UTF-8" in result.stderr
    (tmp_path / "metrics.jsonl").write_text(line)
    (tmp_path / "summary.json").write_bytes(b'{"heldout_tasks": 4,\n "note": "\xe9"}')
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and f"{tmp_path / 'summary.json'}: line 2: not UTF-8" in result.stderr
    (tmp_path / "summary.json").unlink()
    page = tmp_path / "page.html"
    result = CliRunner().invoke(app, ["report", str(tmp_path), f"{tmp_path}/", "--out", str(page)])
    assert result.exit_code == 2 and "the same run folder twice" in result.stderr and not page.exists()


def test_out_is_a_page_whose_png_folder_is_not_a_run_folder(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    (run / "heldout.png").write_bytes(b"the job's own plot")
    (run / "best").mkdir()
    (run / "best" / "config.json").write_text("{}")  # the model validation chose
    files = sorted(run.rglob("*"))
    for out, says, reported in [
        (run, "ending in .html", run),  # was: PNGs written into the run folder, then "Is a directory"
        (tmp_path / "page", "ending in .html", run),
        (tmp_path / "run.html", f"the run folder {run}/", run),  # its PNG folder: run/
        (tmp_path / "run.html", f"go in {run}/, which holds best, metrics.jsonl", runs[1]),  # another run's page
        (run / "best.html", f"go in {run / 'best'}/, which holds config.json;", run),  # was: among the model's files
    ]:
        result = CliRunner().invoke(app, ["report", str(reported), "--out", str(out)])
        assert result.exit_code == 2, result.output
        assert f"--out {out}: " in result.stderr and says in result.stderr
    assert sorted(run.rglob("*")) == files and (run / "heldout.png").read_bytes() == b"the job's own plot"
    assert (
        not (tmp_path / "page").exists() and not (tmp_path / "run.html").exists() and not (run / "best.html").exists()
    )
    (tmp_path / "page").mkdir()  # a folder of PNGs and what a file browser leaves there: the page's own, rewritten
    for name in ("success.png", ".DS_Store", "Thumbs.db"):
        (tmp_path / "page" / name).write_bytes(b"")
    result = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "page.html")])
    assert result.exit_code == 0, result.output


# ---- headless Chromium over the DevTools protocol ----------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--no-first-run", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]  # fmt: skip
IMAGES_JS = """new Promise(resolve => {
  const done = () => resolve({href: location.href, title: document.title, images: [...document.images].map(
    i => ({src: i.getAttribute("src"), complete: i.complete, width: i.naturalWidth}))});
  document.readyState === "complete" ? done() : addEventListener("load", done);
})"""


def images_in_chromium(page: Path, profile: Path) -> dict:
    """Open `page` in headless Chromium; after its load event: URL, title, each <img>'s state."""
    exe = shutil.which("chromium")
    assert exe, "no chromium: scripts/test.sh installs Debian's (apt-get install chromium)"
    args = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"]
    browser = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Chromium writes its DevTools port here; the deadline guards a hang, it times nothing
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 120
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert browser.poll() is None, "chromium exited before opening DevTools"
            assert time.monotonic() < deadline, "chromium never opened DevTools"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list").json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        with connect(url, max_size=None, open_timeout=120) as ws:
            cdp = _Cdp(ws)
            cdp.call("Page.enable")
            navigated = cdp.call("Page.navigate", url=page.as_uri())
            assert "errorText" not in navigated, navigated
            cdp.wait_for("Page.loadEventFired")
            answer = cdp.call(
                "Runtime.evaluate",
                expression=IMAGES_JS,
                awaitPromise=True,
                returnByValue=True,
            )
            return answer["result"]["value"]
    finally:
        browser.terminate()
        try:
            browser.wait(timeout=30)
        except subprocess.TimeoutExpired:
            browser.kill()
            browser.wait()


class _Cdp:
    """Request/response over one DevTools websocket; events seen meanwhile are kept."""

    def __init__(self, ws) -> None:
        self.ws, self.last_id, self.events = ws, 0, []

    def _receive(self) -> dict:
        return json.loads(self.ws.recv(timeout=120))

    def call(self, method: str, **params) -> dict:
        self.last_id += 1
        request = {"id": self.last_id, "method": method, "params": params}
        self.ws.send(json.dumps(request))
        while True:
            message = self._receive()
            if message.get("id") == self.last_id:
                assert "error" not in message, message
                return message["result"]
            self.events.append(message)

    def wait_for(self, event: str) -> None:
        while not any(m.get("method") == event for m in self.events):
            self.events.append(self._receive())


def test_the_trailing_mean_beside_a_batch_curve_averages_each_update_with_those_before():
    assert trailing_mean([1.0, 2.0, 3.0, 4.0, 5.0, 9.0], 3) == [1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert trailing_mean([0.5], 5) == [0.5] and trailing_mean([], 5) == []


def test_a_dollar_in_a_task_family_is_drawn_as_text_not_math(tmp_path):
    """matplotlib reads `$...$` as math: `x $\\alpha_$ y` failed the plot (and the job at its end), `in $_usd$` drew
    a subscript."""
    from harnessrl.eval.plots import plot_heldout

    families = {name: {"success_before": 0.2, "success_after": 0.5} for name in ("x $\\alpha_$ y", "in $_usd$ total")}
    plot_heldout({"heldout_success_before": 0.2, "heldout_by_family": families}, tmp_path / "heldout.png")
    assert (tmp_path / "heldout.png").read_bytes().startswith(b"\x89PNG")
