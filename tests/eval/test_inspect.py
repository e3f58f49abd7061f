"""`harnessrl inspect` on an episode recorded through the gateway: call boundaries and the
trainer's own loss mask."""

import asyncio
import re

import pytest
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.eval.inspect import (
    NotThisTokenizer,
    check_vocabulary,
    completion_masks,
    embedding_rows,
    load_tokenizer,
)
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.train.sequences import episode_sequences
from harnessrl.types import Episode, Outcome, Task
from tests.conftest import ADMIN_KEY
from tests.harness.scripted_swarm import run_scripted

SEARCHER = {"agent": "searcher", "trainable": "false"}
# a --logprobs line: position, mask, logprob, p, token
TOKEN = re.compile(r"^\s+(\d+)\s+([01])\s+(-?\d+\.\d{4})\s+(\d+\.\d{3})\s+(.+)$")
HEADER = re.compile(
    r"── +call (\d+) · agent (\S+)( \(sub-agent\))?(?: · lineage \S+)?(?: · model \S+)?(?: · parent_call \d+)? · policy_version \d+ · "
    r"trainable (\w+) · finish_reason \w+ · extends_call (\w+) · sequence (\w+)"
)


async def _record(policy) -> Episode:
    """Main agent; a frozen sub-agent on its own; the main agent again (extending its
    first call); the sub-agent on the main agent's lineage (extending that)."""
    gateway = GatewayClient(ADMIN_KEY, app=create_app(policy, ADMIN_KEY))
    try:
        episode_id, key = await gateway.create_episode(Task(id="inspect-1"))
        chat = gateway.openai(key).chat.completions
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        first = await chat.create(model="tiny", messages=messages, max_tokens=8, seed=1)
        alone = [{"role": "user", "content": "Find Paris."}]
        await chat.create(model="tiny", messages=alone, max_tokens=6, metadata=SEARCHER)
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "And tomorrow?"})
        third = await chat.create(model="tiny", messages=messages, max_tokens=8, seed=3)
        messages.append(third.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "Summarise."})
        await chat.create(model="tiny", messages=messages, max_tokens=6, metadata={**SEARCHER, "lineage": "main"})
        return await gateway.finish(episode_id, Outcome(answer="sunny"))
    finally:
        await gateway.aclose()


@pytest.fixture(scope="module")
def episode(policy) -> Episode:
    recorded = asyncio.run(_record(policy))
    assert [c.agent for c in recorded.calls] == ["main", "searcher", "main", "searcher"]
    assert [c.extends_call for c in recorded.calls] == [None, None, 0, 2]
    return recorded


def _inspect(*args: str, env: dict | None = None):
    result = CliRunner(env=env).invoke(app, ["inspect", *args, "--model", "tiny"])
    assert result.exit_code == 0, result.output
    return result.stdout


def _failure(*args: str) -> str:
    result = CliRunner().invoke(app, ["inspect", *args, "--model", "tiny"])
    assert result.exit_code == 2, result.output
    return result.stderr


def _parse(output: str) -> tuple[list[tuple], list[list[tuple[int, float]]]]:
    """The call headers and, under each, its listed completion tokens (mask, logprob)."""
    headers, tokens = [], []
    for line in output.splitlines():
        if match := HEADER.search(line):
            headers.append(match.groups())
            tokens.append([])
        elif (match := TOKEN.match(line)) and tokens:
            tokens[-1].append((int(match[2]), float(match[3])))
    return headers, tokens


def test_every_call_is_shown_with_the_mask_train_sequences_builds(episode, tmp_path):
    path = tmp_path / "episodes.jsonl"
    other = episode.model_copy(update={"id": "other"})
    path.write_text(other.to_json() + "\n" + episode.to_json() + "\n")
    out = _inspect(str(path), "--index", "1", "--logprobs")
    assert f"episode {episode.id} · task inspect-1" in out
    headers, tokens = _parse(out)
    # (call, agent, sub-agent mark, trainable, extends_call, sequence)
    assert headers == [
        ("0", "main", None, "True", "None", "0"),
        ("1", "searcher", " (sub-agent)", "False", "None", "none"),
        ("2", "main", None, "True", "0", "0"),
        ("3", "searcher", " (sub-agent)", "False", "2", "0"),
    ]
    # one training sequence; the sub-agent's lone call 1 has no loss token and is dropped
    (sequence,) = episode_sequences(episode)
    assert sequence.calls == [0, 2, 3]
    for index, call in enumerate(episode.calls):
        shown = [bit for bit, _ in tokens[index]]
        logprobs = [round(lp, 4) for lp in call.sampled_logprobs]
        assert [round(lp, 4) for _, lp in tokens[index]] == logprobs
        if index in sequence.calls:  # the sequence's mask at the completion's positions
            start, end = (
                len(call.prompt_ids),
                len(call.prompt_ids + call.completion_ids),
            )
            assert shown == sequence.loss_mask[start:end]
        assert shown == [int(call.trainable)] * len(call.completion_ids)
    assert sum(bit for listed in tokens for bit, _ in listed) == sequence.loss_tokens > 0
    # the extending call shows only its new prompt tokens
    first, third = episode.calls[0], episode.calls[2]
    head = len(first.prompt_ids) + len(first.completion_ids)
    assert f"prompt: {len(third.prompt_ids)} tokens, the first {head} are call 0's" in out


def test_a_greedy_reply_shows_untrained_as_rl_treats_it(episode):
    greedy = episode.model_copy(deep=True)
    greedy.calls[2].temperature = 0.0  # a greedy reply: RL masks it out, SFT would not
    masks, _ = completion_masks(greedy)
    assert masks[0] == [1] * len(greedy.calls[0].completion_ids) and masks[2] == [0] * len(
        greedy.calls[2].completion_ids
    )
    demo = greedy.model_copy(deep=True)
    for call in demo.calls:
        call.demonstration = True
    masks, _ = completion_masks(demo)  # a demonstration: SFT trains every trainable call's tokens
    assert masks[2] == [1] * len(demo.calls[2].completion_ids) and masks[1] == [0] * len(demo.calls[1].completion_ids)


def test_colours_follow_the_mask(episode, tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_text(episode.to_json() + "\n")
    env = {"FORCE_COLOR": "1", "TERM": "xterm-256color", "NO_COLOR": None}
    sections = _inspect(str(path), env=env).split("── call ")[1:]
    assert len(sections) == 4
    for call, section in zip(episode.calls, sections):
        completion = section.split("completion:", 1)[1].splitlines()[1]  # the tokens
        sgr = re.findall(r"\x1b\[([\d;]+)m", completion)
        codes = {int(c) for codes in sgr for c in codes.split(";")}
        green, red = bool(codes & {32, 92}), bool(codes & {31, 91})
        assert (green, red) == (call.trainable, not call.trainable), (call.agent, codes)


def test_a_failure_reason_holding_escape_codes_is_shown_not_obeyed(episode, tmp_path):
    """An exception's text can quote what the model wrote: `\x1b[2J` would clear the terminal."""
    failed = episode.model_copy(update={"status": "failed", "failure_reason": "harness raised ValueError: \x1b[2Jboom"})
    path = tmp_path / "episodes.jsonl"
    path.write_text(failed.to_json() + "\n")
    shown = _inspect(str(path))
    assert "\x1b[2J" not in shown and "ValueError: \\x1b[2Jboom" in shown


def test_an_episode_id_is_found_in_a_run_folder(episode, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    demo = episode.model_copy(update={"id": "demo-1"})
    (run / "demos.jsonl").write_text(demo.to_json() + "\n")
    (run / "eval_after.jsonl").write_text(episode.to_json() + "\n")
    out = _inspect(episode.id, "--run", str(run))
    assert f"episode {episode.id} ·" in out and out.count("── call ") == 4
    (run / "sft").mkdir()
    (run / "sft" / "metrics.jsonl").write_text('{"step": 1, "loss/sft": 0.5}\n')
    error = _failure("no-such-id", "--run", str(run))
    assert "no episode with id no-such-id" in error and "eval_after.jsonl" in error
    assert "metrics.jsonl, sft/metrics.jsonl" in error  # which metrics.jsonl: both named by their path in the run
    folder = _failure(str(run))  # the run folder as EPISODE was "no such file"
    assert f"{run}: a folder; give a JSONL file of episodes, or an episode id with --run {run}" in folder


def test_bad_input_fails_with_exit_2_naming_it(episode, tmp_path):
    error = _failure(str(tmp_path / "nope.jsonl"))
    assert "no such file" in error and "--run" in error
    path = tmp_path / "episodes.jsonl"
    cut = episode.model_copy(update={"id": "cut-1"}).to_json()[:50]  # a killed run's last line
    assert '"id":"cut-1"' in cut
    path.write_text(episode.to_json() + "\n" + cut + "\n")
    assert f"episode {episode.id} ·" in _inspect(str(path))  # an intact episode is shown beside a cut line
    assert f"episode {episode.id} ·" in _inspect(str(path), "--id", episode.id)
    assert f"{path}: line 2: line: Invalid JSON" in _failure(str(path), "--index", "1")
    assert f"{path}: line 2" in _failure(str(path), "--id", "cut-1")
    assert f"{path}: line 2" in _failure("cut-1", "--run", str(tmp_path))
    path.write_text(episode.to_json() + "\n")
    assert "--index 3" in _failure(str(path), "--index", "3")
    result = CliRunner().invoke(app, ["inspect", str(path), "--model", str(tmp_path)])
    assert result.exit_code == 2 and "not 'tiny', 'tiny-base'" in result.stderr
    calls = [
        c.model_copy(update={"lineage": "sub", "parent_call": i - 1 if i else None})
        for i, c in enumerate(episode.calls)
    ]
    path.write_text(episode.model_copy(update={"calls": calls}).to_json() + "\n")  # one lineage with two parents
    assert "lineage 'sub'" in _failure(str(path))


def test_ids_beyond_the_tokenizers_vocabulary_and_the_models_rows_are_refused(episode, tmp_path):
    """Another model's episode (SmolLM2's ids under tiny-base's 2,050 tokens) would decode to empty pieces."""
    other = episode.model_copy(deep=True)
    other.calls[1].completion_ids[-1] = 49000
    tokenizer = load_tokenizer("tiny")
    with pytest.raises(NotThisTokenizer) as refused:
        check_vocabulary(other, tokenizer)
    assert "call 1 holds token id 49000, beyond this tokenizer's vocabulary (2050 tokens): pass --model" in str(
        refused.value
    )
    check_vocabulary(other, tokenizer, rows=49152)  # a padded embedding: ids the model can sample past the tokenizer
    assert embedding_rows("tiny-base") == len(load_tokenizer("tiny-base"))
    path = tmp_path / "other.jsonl"
    path.write_text(other.to_json() + "\n")
    assert "pass --model" in _failure(str(path))  # the command: exit 2, not a traceback


def test_flags_that_pick_an_episode_twice_are_refused(episode, tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_text(episode.to_json() + "\n")
    assert "give one" in _failure(str(path), "--index", "0", "--id", episode.id)
    assert "--run looks EPISODE up as an id" in _failure(str(path), "--run", str(tmp_path))


async def test_a_swarm_episode_shows_its_call_tree(swarm_gateway, tmp_path):
    episode, _, _ = await run_scripted(swarm_gateway, tasks=3)
    path = tmp_path / "episodes.jsonl"
    path.write_text(episode.to_json() + "\n")
    out = _inspect(str(path))
    assert "call tree: 4 lineages · critical steps 4 of 6" in out
    assert "main (agent main): calls 0, 1, 5" in out
    for k in range(3):  # the sub-agents ran concurrently: which call each made first varies
        assert re.search(rf"\n  scout/{k} \(agent scout\) ← call 1: calls [234] · frozen \(sub\)\n", out)
        assert re.search(
            rf"──   call [234] · agent scout \(sub-agent\) · lineage scout/{k} · model sub · parent_call 1 ·", out
        )
