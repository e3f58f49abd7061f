import json
import re

import pytest

from harnessrl.eval.probe import _behind, context_grid, decisions, probe, record_grid, score
from harnessrl.policy import Policy
from harnessrl.policy.mixture import SKILLS, Mixture, render_item
from harnessrl.policy.model import TINY_BASE
from harnessrl.policy.sources import SHIPPED
from harnessrl.policy.tiny import build_tokenizer
from harnessrl.policy.toolformat import name_tokens

# about half of what the shipped checkpoint (v5) scores on these 25 items per skill (copy 0.96, recall 0.88,
# tool_args 1.00, record_field 0.24, question_call 1.00, entity_call 1.00, list_calls 0.48; greedy; the same
# with ATEN_CPU_CAPABILITY=default), well above an untrained model (0 on every skill); v3 scored
# record_field 0.08 here, under the floor, and v4 list_calls 0
FLOORS = {
    "copy": 0.46,
    "recall": 0.48,
    "tool_args": 0.46,
    "record_field": 0.16,
    "question_call": 0.5,
    "entity_call": 0.5,
    "list_calls": 0.24,
}


def test_scoring_is_exact():
    mixture = Mixture(seed=3)
    text_item = mixture.item("copy")
    assert score(text_item, f"  {text_item.answer}\n") and not score(text_item, text_item.answer + ".")
    tool_item = mixture.item("tool_args")
    call = tool_item.expected_call
    assert score(tool_item, f"<tool_call>{json.dumps(call)}</tool_call>")
    wrong = dict(call, arguments={k: "x" for k in call["arguments"]})
    assert not score(tool_item, f"<tool_call>{json.dumps(wrong)}</tool_call>")
    assert not score(tool_item, "<tool_call>{not json</tool_call>")
    batch = next(i for i in (mixture.item("list_calls") for _ in range(20)) if len(i.expected_call) >= 3)
    text = [f"<tool_call>{json.dumps(c)}</tool_call>" for c in batch.expected_call]
    assert batch.answer == "".join(text) and score(batch, "".join(text))
    assert not score(batch, "".join(text[:-1])) and not score(batch, "".join([text[1], text[0], *text[2:]]))


def test_items_render_with_the_tiny_template_and_vary():
    tok = build_tokenizer()
    mixture = Mixture(seed=5)
    for skill in SKILLS:
        a, b = mixture.item(skill), mixture.item(skill)
        assert a.answer != b.answer
        assert render_item(tok, a, with_answer=True).endswith(a.answer + "<|im_end|>\n")
        assert render_item(tok, a, with_answer=False).endswith("<|im_start|>assistant\n")


def test_a_chain_item_asks_for_the_next_link_or_the_value_as_the_question_says():
    mixture = Mixture(seed=13)
    items = [mixture.item("record_chain") for _ in range(200)]
    for item in items:
        question, results = item.messages[0]["content"], [m["content"] for m in item.messages if m["role"] == "tool"]
        # each link is "the F of X" or "X's F" (drawn names and words hold neither); two asks say "the F of N" too
        links = question.count(" of ") + question.count("'s ") - bool(re.match(r"(What is|And) the \w+ of ", question))
        lookup = item.tools[0]["function"]["name"]
        assert len(results) == len(item.trained) + 1 <= links + 1
        hop = isinstance(item.expected_call, dict) and item.expected_call["name"] == lookup
        assert hop == (len(results) <= links), question  # a lookup while links are left, then the value
        value = next(iter(item.expected_call["arguments"].values())) if item.expected_call else item.answer
        assert value in results[-1] and score(item, item.answer)
        assert not hop or all(value not in earlier for earlier in results[:-1])  # a new name, in the last result
    assert {len(i.trained) for i in items} == {0, 1, 2}  # items stop at every decision of a chain


def test_the_shipped_tiny_base_loads_and_beats_clear_floors_on_fresh_items():
    assert (TINY_BASE / "model.safetensors").stat().st_size <= 25 * 1024 * 1024
    policy = Policy.load("tiny-base")
    try:
        assert policy.tokenizer.get_vocab() == build_tokenizer().get_vocab()  # the tiny tokenizer, unchanged
        scores = probe(policy, items_per_skill=25, seed=987_654)  # fresh: neither pretraining nor the README used it
    finally:
        policy.close()
    for skill, floor in FLOORS.items():
        assert scores[skill] >= floor, scores


def test_the_long_context_base_keeps_its_skills_behind_an_earlier_conversation():
    assert (SHIPPED["tiny-base-long"] / "model.safetensors").stat().st_size <= 25 * 1024 * 1024
    policy = Policy.load("tiny-base-long")
    try:
        assert policy.tokenizer.get_vocab() == build_tokenizer().get_vocab()
        scores = probe(policy, items_per_skill=12, seed=987_654)
        scores.pop("record_chain")  # added to the mixture after this base was pretrained (0.1-0.3)
        behind = context_grid(policy, items=6, seed=987_654, lengths=(1024,), skills=("copy", "record_field"))
    finally:
        policy.close()
    # on 25 items a skill it scored 0.80 (list_calls) to 1.00; behind 1,024 tokens 1.00 on 10 items, where
    # tiny-base scores 0.00 (copy) and 0.10 (record_field)
    assert min(scores.values()) >= 0.4, scores
    assert min(behind.values()) >= 0.5, behind


def test_the_record_grid_separates_finding_the_field_from_finding_the_record():
    policy = Policy.load("tiny-base")
    try:
        grid = record_grid(policy, items=8, seed=987_654)
    finally:
        policy.close()
    assert set(grid) == {f"fields={f} records={r}" for f in (1, 2, 4) for r in (1, 3)}
    assert grid["fields=1 records=1"] >= 0.75  # one value to copy: the shipped model copies it (0.975 of 40)


def test_a_sampled_probe_is_seeded_and_really_samples():
    policy = Policy.load("tiny-base")
    try:
        first, again = (probe(policy, items_per_skill=6, seed=987_654, temperature=1.0) for _ in range(2))
        flat = probe(policy, items_per_skill=6, seed=987_654, temperature=50.0)  # near-uniform: nothing exact
    finally:
        policy.close()
    assert first == again
    assert max(flat.values()) == 0.0 < max(first.values())


def test_the_context_grid_puts_the_same_items_behind_longer_conversations():
    policy = Policy.load("tiny-base")
    try:
        items = [Mixture(5).item("copy"), Mixture(6).item("tool_args"), Mixture(8).item("recall")]
        for item in items:
            longer = _behind(policy, item, Mixture(7), 300)
            assert longer.answer == item.answer and longer.tools == item.tools
            assert longer.messages[-1] == item.messages[-1] and longer.messages[0]["role"] == item.messages[0]["role"]
            grown = len(policy.encode(policy.render(longer.messages, longer.tools, generation_prompt=True)))
            plain = len(policy.encode(policy.render(item.messages, item.tools, generation_prompt=True)))
            assert grown - plain >= 300
        grid = context_grid(policy, items=4, seed=987_654, lengths=(0, 128), skills=("copy", "recall"))
    finally:
        policy.close()
    assert set(grid) == {f"{s} context={n}" for s in ("copy", "recall") for n in (0, 128)}
    assert grid["copy context=0"] >= 0.5  # no context: the plain probe's items (v5 copies 0.96 of them)


def test_decisions_give_the_probability_of_each_recorded_tool_name_by_family_and_call(tmp_path):
    import torch

    from harnessrl.train.losses import token_logprobs
    from harnessrl.train.sft import demonstration
    from harnessrl.types import Task
    from tests.conftest import cli

    policy = Policy.load("tiny")
    tok = policy.tokenizer
    ask = [{"role": "user", "content": "Tide at Olmar?"}]
    call = '<tool_call>{"name": "get_tide", "arguments": {"place": "Olmar"}}</tool_call>'
    tagged = demonstration(tok, ask, call, task=Task(id="t", data={"family": "tides"}))
    plain = demonstration(tok, ask, call, task=Task(id="u"))
    text = demonstration(tok, ask, "Low at noon.", task=Task(id="v"))  # no call: no decision to read
    try:
        found = decisions(policy, [tagged, plain, text])
        (recorded,) = tagged.calls
        ids = torch.tensor([recorded.prompt_ids + recorded.completion_ids])
        with torch.no_grad():
            logp = token_logprobs(policy.model(ids).logits.float(), ids)[0][0, len(recorded.prompt_ids) - 1 :]
        marks = torch.tensor(name_tokens(tok, recorded.completion_ids)).bool()
    finally:
        policy.close()
    expected = float(logp[marks].sum().exp())  # every token of "get_tide", by hand
    assert 0 < expected < 1
    assert found == {
        "all call 1 get_tide": {"p": pytest.approx(expected, rel=1e-5), "n": 1},
        "tides call 1 get_tide": {"p": pytest.approx(expected, rel=1e-5), "n": 1},
    }
    path = tmp_path / "demos.jsonl"
    path.write_text(tagged.to_json() + "\n" + plain.to_json()[:50] + "\n")
    done = cli("probe", "--model", "tiny", "--decisions", path)
    assert done.exit_code == 2 and "line 2" in done.stderr


def test_decisions_refuse_another_models_episodes_naming_the_call(tmp_path):
    """An id past tiny's 2,050 rows (a SmolLM2 run's episodes) failed the embedding with an IndexError traceback."""
    from harnessrl.train.sft import demonstration
    from tests.conftest import cli

    tok = build_tokenizer()
    call = '<tool_call>{"name": "get_tide", "arguments": {"place": "Olmar"}}</tool_call>'
    other = demonstration(tok, [{"role": "user", "content": "Tide at Olmar?"}], call)
    other.calls[0].prompt_ids[-1] = 49000
    path = tmp_path / "demos.jsonl"
    path.write_text(other.to_json() + "\n")
    done = cli("probe", "--model", "tiny", "--decisions", path)
    assert done.exit_code == 2, done.output
    assert f"--decisions {path}: episode {other.id}: call 0 holds token id 49000" in done.stderr


def test_chain_hops_splits_the_items_by_what_they_ask_and_scores_calls_of_the_lookup():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "chain_hops.py"
    spec = importlib.util.spec_from_file_location("chain_hops", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mixture = Mixture(seed=21)
    items = [mixture.item("record_chain") for _ in range(16)]
    policy = Policy.load("tiny")  # untrained: it never writes a call
    try:
        shares = module.lookup_shares(policy, items)
    finally:
        policy.close()
    hops = sum(
        isinstance(i.expected_call, dict) and i.expected_call["name"] == i.tools[0]["function"]["name"] for i in items
    )
    assert shares["items"] == {"hop": hops, "answer": 16 - hops} and 0 < hops < 16
    assert shares["hop"] == shares["answer"] == 0.0
