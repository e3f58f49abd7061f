"""scripts/pretrain_tiny_base.py at toy size: resumable, a second stage from given weights, bad flags named."""

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from harnessrl.policy.mixture import SKILLS, Mixture, render_item
from harnessrl.policy.tiny import build_tiny, build_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_tiny_base.py"
TOY = ["--rows", "2", "--width", "64", "--hidden", "32", "--layers", "1", "--warmup", "1", "--probe-items", "1"]


def pretrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *TOY, *args], capture_output=True, text=True, timeout=600)


def steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()]


def test_a_stopped_run_resumes_without_gap_and_a_second_stage_starts_from_its_weights(tmp_path):
    stage1, stage2 = tmp_path / "stage1", tmp_path / "stage2"
    first = pretrain("--out", str(stage1), "--steps", "3", "--export-dir", str(tmp_path / "export1"))
    assert first.returncode == 0, first.stderr[-2000:]
    more = pretrain("--out", str(stage1), "--steps", "5", "--resume", "--export-dir", str(tmp_path / "export1"))
    assert more.returncode == 0, more.stderr[-2000:]
    assert steps(stage1) == [1, 2, 3, 4, 5]
    refused("--out", str(stage1), "--steps", "6", "--resume", "--lr", "0.5", match="--lr")  # a resume keeps the rate
    with open(stage1 / "log.jsonl", "a") as log:
        log.write('{"step": 6, "loss": 7.1, "lr')  # a kill mid-append
    again = pretrain("--out", str(stage1), "--steps", "6", "--resume", "--export-dir", str(tmp_path / "export1"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert steps(stage1) == [1, 2, 3, 4, 5, 6]
    exported = tmp_path / "export1"
    assert (exported / "model.safetensors").is_file()
    assert set(json.loads((exported / "probe.json").read_text())["final"]) == set(SKILLS)
    init = ["--init", str(exported), "--weights", "record_field=0.6,entity_call=0.3", "--records-ramp", "2",
            "--follow-ups", "2"]  # fmt: skip
    second = pretrain("--out", str(stage2), "--steps", "3", "--seed", "1", *init, "--export-dir", str(tmp_path / "e2"))
    assert second.returncode == 0, second.stderr[-2000:]
    assert "--init" in (tmp_path / "e2" / "README.md").read_text()
    resume = ["--out", str(stage2), "--steps", "4", "--resume", "--export-dir", str(tmp_path / "e2")]
    refused(*resume, "--weights", "copy=1", match="--weights")  # a resumed stage keeps its flags: another is refused
    refused(*resume, *init[:-2], "--follow-ups", "3", match="--follow-ups")
    refused(*resume, "--fields", "1-1", match="--fields")
    (stage2 / "moved").mkdir()
    exported.rename(stage2 / "moved" / "export1")  # its --init folder gone: a resume starts from its checkpoint
    resumed = pretrain(*resume)  # the run's seed, init, weights, ramp and follow-ups without repeating them
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert steps(stage2) == [1, 2, 3, 4]
    again = pretrain("--out", str(stage2), "--export-only", "--export-dir", str(tmp_path / "e3"))
    assert again.returncode == 0, again.stderr[-2000:]
    card = (tmp_path / "e3" / "README.md").read_text()
    assert "--init" in card and "record_field=0.6" in card and " 4 steps" in card  # each step's precision counted


def test_batches_packed_in_worker_processes_train_resume_and_are_counted(tmp_path):
    run, export = tmp_path / "run", tmp_path / "export"
    workers = ["--workers", "2", "--out", str(run), "--export-dir", str(export)]
    first = pretrain(*workers, "--steps", "3")
    assert first.returncode == 0, first.stderr[-2000:]
    seen = _items_seen(export)
    more = pretrain(*workers, "--steps", "6", "--resume")
    assert more.returncode == 0, more.stderr[-2000:]
    assert steps(run) == [1, 2, 3, 4, 5, 6]
    assert sum(_items_seen(export).values()) > sum(seen.values()) > 0  # the workers' items reach the model card


def test_each_worker_packs_its_own_items():
    module, tokenizer = _script(), build_tokenizer()
    args = module.build_parser().parse_args([*TOY, "--workers", "2"])
    stream = module.Stream(tokenizer, args, module.parse_weights(""), start=0)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
    batches = [batch for batch, _ in zip(loader, range(4), strict=False)]
    assert all(ids.shape == kept.shape == (2, 64) for ids, _, kept, _ in batches)
    assert sum(sum(drawn.values()) for *_, drawn in batches) > 0  # (an item can span several 64-token rows)
    assert not torch.equal(batches[0][0], batches[1][0])  # two workers, two streams of items


def _items_seen(export: Path) -> dict[str, int]:
    line = next(x for x in (export / "README.md").read_text().splitlines() if "Items seen:" in x)
    return json.loads(line.split("Items seen:")[1].strip().rstrip("."))


def test_records_and_fields_spans_parse_and_bad_ones_are_named():
    module = _script()
    assert module.span("--fields", "1-1") == (1, 1) and module.span("--records", "3") == (3, 3)
    for bad in ("3-1", "0-2", "two"):
        with pytest.raises(SystemExit, match="--records"):
            module.span("--records", bad)


def test_an_unknown_skill_in_weights_is_named(tmp_path):
    refused("--out", str(tmp_path / "run"), "--steps", "1", "--weights", "reasoning=1", match="reasoning")
    refused("--out", str(tmp_path / "run2"), "--steps", "1", "--workers", "-1", match="--workers")
    run = ["--out", str(tmp_path / "run3"), "--steps", "1"]
    refused(*run, "--weights", "copy", match="expected skill=number")
    refused(*run, "--weights", "copy=-1", match="0 or more")
    zero = ",".join(f"{skill}=0" for skill in _script().WEIGHTS)
    refused(*run, "--weights", zero, match="every weight is 0")
    refused(*run, "--follow-ups", "-1", match="--follow-ups")
    refused(*run, "--export-dir", str(tmp_path), match="--export-dir")  # it would replace the run's own folder
    refused(*run, "--init", str(tmp_path / "no-model"), match="--init")


def test_a_teacher_holds_the_run_to_its_distribution(tmp_path):
    first = pretrain("--out", str(tmp_path / "a"), "--steps", "2", "--export-dir", str(tmp_path / "teacher"))
    assert first.returncode == 0, first.stderr[-2000:]
    held = ["--init", str(tmp_path / "teacher"), "--teacher", str(tmp_path / "teacher"), "--lr", "0.01"]
    done = pretrain("--out", str(tmp_path / "b"), "--steps", "3", *held, "--export-dir", str(tmp_path / "e"))
    assert done.returncode == 0, done.stderr[-2000:]
    kls = [json.loads(line)["kl"] for line in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert kls[0] == pytest.approx(0.0, abs=1e-3) and kls[-1] > kls[0]  # starts as the teacher, then moves off it
    refused("--out", str(tmp_path / "c"), "--steps", "1", "--teacher", str(tmp_path / "none"), match="--teacher")
    refused("--out", str(tmp_path / "d"), "--steps", "1", "--distill-skip", "records", match="--distill-skip")


def test_the_skipped_skills_tokens_are_left_out_of_the_teachers_hold():
    module, tokenizer = _script(), build_tokenizer()
    packer = module.Packer(tokenizer, seed=5, width=256, weights={"copy": 3.0, "record_field": 1.0})
    packer.skip = {"record_field"}
    drawn = []
    original = packer._next
    packer._next = lambda: drawn.append(result := original()) or result
    ids, labels, kept = packer.batch(8)
    flat = [kind for more, _, kind in drawn for _ in more][: ids.numel()]
    assert {"copy", "record_field"} <= set(flat)
    assert kept.flatten().tolist() == [int(kind == "copy") for kind in flat]


def test_the_distillation_kl_counts_trained_positions_only():
    module = _script()
    logits, teacher = torch.randn(2, 5, 7), torch.randn(2, 5, 7)
    labels = torch.tensor([[-100, 3, -100, -100, 1], [-100, -100, -100, -100, -100]])
    assert module.distill_kl(logits, logits.clone(), labels).item() == pytest.approx(0.0, abs=1e-6)
    where = [(0, 0), (0, 3)]  # positions 0 and 3 of row 0 predict the labelled tokens 1 and 4
    expected = sum(
        torch.nn.functional.kl_div(logits[r, t].log_softmax(-1), teacher[r, t].log_softmax(-1), log_target=True,
                                   reduction="sum")
        for r, t in where
    ) / len(where)  # fmt: skip
    assert module.distill_kl(logits, teacher, labels).item() == pytest.approx(expected.item(), rel=1e-5)


def test_a_run_killed_before_its_first_checkpoint_starts_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text('{"step": 1, "loss": 7.0, "lr": 0.001, "tok_s": 1, "wall_seconds": 1}\n')
    done = pretrain("--out", str(run), "--steps", "2", "--export-dir", str(tmp_path / "export"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert steps(run) == [1, 2]


def refused(*args: str, match: str) -> None:
    """The script's main in this process (a refusal comes before any training): it exits naming `match`. Where it
    trains instead (the check is missing), its export goes to a scratch folder, never over the package's tiny-base."""
    with pytest.raises(SystemExit, match=match):
        _script().main([*TOY, "--export-dir", tempfile.mkdtemp(), *args])


def _script():
    spec = importlib.util.spec_from_file_location("pretrain_tiny_base", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("skill", ["record_field", "record_chain"])
def test_a_drill_trains_every_answer_and_nothing_else(skill):
    tokenizer = build_tokenizer()
    packer = _script().Packer(tokenizer, seed=3, width=1024, weights={skill: 1.0})
    packer.mixture.follow_ups = 3
    item = next(i for i in (packer.mixture.item(skill) for _ in range(50)) if i.trained)
    ids, labels = packer.render(item)
    replies = [item.messages[i]["content"] for i in item.trained] + [item.answer]
    trained = tokenizer.decode([i for i, label in zip(ids, labels) if label != -100])
    assert trained == "".join(f"{r}<|im_end|>\n" for r in replies) + "<|endoftext|>"
    assert tokenizer.decode(ids).endswith(render_item(tokenizer, item, with_answer=True) + "<|endoftext|>")


def test_history_goes_before_the_question_and_its_replies_are_trained_too():
    tokenizer = build_tokenizer()
    packer = _script().Packer(tokenizer, seed=4, width=512, weights={"record_field": 1.0})
    packer.mixture.follow_ups, packer.mixture.history = 2, (2, 2)
    item = next(i for i in (packer.mixture.item("record_field") for _ in range(50)) if len(i.trained) > 2)
    lead = 1 if item.messages[0]["role"] == "system" else 0
    assert [m["role"] for m in item.messages[lead : lead + 4]] == ["user", "assistant"] * 2  # two answered exchanges
    ids, labels = packer.render(item)
    replies = [item.messages[i]["content"] for i in item.trained] + [item.answer]
    trained = tokenizer.decode([i for i, label in zip(ids, labels) if label != -100])
    assert trained == "".join(f"{r}<|im_end|>\n" for r in replies) + "<|endoftext|>"
    assert _script().span("--history", "0-12", least=0) == (0, 12)


def test_probe_items_ask_one_question():
    mixture = Mixture(seed=11)  # follow_ups 0, as the probe draws them
    assert all(not mixture.item("record_field").trained for _ in range(40))


def test_a_grown_model_computes_what_the_smaller_one_did():
    grown = _script().grown
    small, tokenizer = build_tiny(seed=4, hidden=32, layers=2)
    ids = torch.tensor([tokenizer("What is the river of Kraithon? [r1] Kraithon: river Zal")["input_ids"]])
    for layers in (3, 4, 5):
        big, _ = build_tiny(seed=5, hidden=32, layers=layers)
        big.load_state_dict(grown(small.state_dict(), 2, layers))
        with torch.no_grad():
            assert torch.equal(big(ids).logits, small(ids).logits)
        assert sum(p.abs().sum() > 0 for p in big.parameters()) < len(list(big.parameters()))  # zeroed copies
    with pytest.raises(SystemExit, match="cannot shrink"):
        grown(small.state_dict(), 2, 1)


def test_size_curves_put_runs_of_two_sizes_on_one_time_axis(tmp_path, capsys):
    from harnessrl.train.checkpoint import save_checkpoint

    script = SCRIPT.with_name("size_curves.py")
    spec = importlib.util.spec_from_file_location("size_curves", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for hidden, layers in ((32, 1), (48, 2)):
        run = tmp_path / f"run{hidden}"
        model, tokenizer = build_tiny(hidden=hidden, layers=layers)
        write = lambda f, m=model, t=tokenizer: (m.save_pretrained(f), t.save_pretrained(f))  # noqa: E731
        save_checkpoint(run / "checkpoints", 20, write, {"args": {"rows": 2, "width": 64}})
        probe = {s: 0.5 for s in SKILLS}
        lines = [json.dumps({"step": 9, "loss": 3.4}), json.dumps({"step": 10, "loss": 2.6, "probe": probe})]
        (run / "log.jsonl").write_text("\n".join([*lines, '{"step": 20, "loss": 2.9, "pro']))  # cut by a kill
    module.main([str(tmp_path / "run32"), str(tmp_path / "run48"), "--steps", "1", "--out", str(tmp_path / "c.png")])
    out = capsys.readouterr().out
    assert "run32/log.jsonl:3: not JSON" in out and (tmp_path / "c.png").is_file()
    small, large = json.loads(out.splitlines()[-1])["runs"]
    assert (small["hidden"], small["layers"], large["hidden"], large["layers"]) == (32, 1, 48, 2)
    assert small["params_m"] < large["params_m"] and small["fp16_mb"] == round(small["params_m"] * 2, 1)
    for run in (small, large):  # minutes are the probe's step times the size's measured seconds a step
        [[step, minutes, scores]] = run["probes"]
        assert step == 10 and minutes == round(10 * run["seconds_per_step"] / 60, 1) and scores["copy"] == 0.5
        assert run["loss"] == [[10, minutes, 3.0]]  # the cut line's loss left out with it
