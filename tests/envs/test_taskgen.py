"""`harnessrl tasks`: the rule generator on a structured corpus, verification, split by document, audit;
and an LLM generator behind a real local OpenAI-compatible server that answers well, malformed,
with a hallucinated quote and with the answer in the question: each failure dropped with its reason."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

from fastapi import FastAPI

from harnessrl.envs.search import taskgen
from harnessrl.envs.search.data import Doc, Quote, SearchTask
from harnessrl.envs.search.index import SearchIndex
from harnessrl.gateway import BackgroundServer
from tests.conftest import cli

TOWNS = ["Arlen", "Bexby", "Corrin", "Dunmore", "Elsby", "Farrow", "Galton", "Hexham", "Ivel", "Jarrow"]
PEOPLE = ["Mara Quell", "Tobin Vask", "Ilse Dorn", "Pell Amsey", "Rhea Sollis", "Odo Brenn", "Una Fenwick"]


def _corpus() -> list[Doc]:
    docs = []
    for i, town in enumerate(TOWNS):
        mayor = PEOPLE[i % len(PEOPLE)]
        text = f"{town} is a river town.\nFounded: {1700 + 13 * i}\nMayor: {mayor}\nPopulation: {2000 + 311 * i}"
        docs.append(Doc(id=f"town-{i}", title=town, text=text))
    for j, person in enumerate(PEOPLE):
        record = {"born": str(1950 + j), "occupation": ["baker", "smith", "clerk", "pilot"][j % 4],
                  "hometown": TOWNS[(j + 3) % len(TOWNS)]}  # fmt: skip
        docs.append(Doc(id=f"person-{j}", title=person, text=json.dumps(record)))
    return docs


def test_rule_generator_keeps_verified_split_tasks_and_audit_agrees(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(d.model_dump_json() + "\n" for d in _corpus()))
    out = tmp_path / "tasks.jsonl"
    command = ["tasks", "--corpus", corpus, "--out", out, "--count", "12", "--hops", "1,2", "--test-share", "0.3"]
    done = cli(*command)
    assert done.exit_code == 0, done.output[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["requested"] == 12 and summary["kept"] == 12 and set(summary["hops"]) == {"1", "2"}
    tasks = [SearchTask.model_validate_json(line) for line in out.read_text().splitlines()]
    docs = {d.id: d for d in _corpus()}
    for task in tasks:
        assert all(taskgen.quote_found(q.text, docs[q.doc_id].text) for q in task.quotes)
        assert task.answer.lower() not in task.question.lower() and task.distractor_doc_ids
        assert all(task.answer not in docs[d].text for d in task.distractor_doc_ids)
        if task.split == "train":  # no test document anywhere in a train task
            assert all(taskgen.doc_split(g, 0.3) == "train" for g in task.gold_doc_ids)
        assert len(task.gold_doc_ids) == task.hops
    audit = cli("tasks", "--corpus", corpus, "--audit", out)
    assert audit.exit_code == 0, audit.output[-2000:]
    assert json.loads(audit.stdout.strip().splitlines()[-1])["pass_share"] == 1.0
    tampered = tasks[0].model_copy(update={"quotes": [tasks[0].quotes[0].model_copy(update={"text": "Mayor: Nobody"})]})
    assert taskgen.audit([tampered], _corpus())["failed"] == {"quote_not_in_source": 1}
    again = cli(*command)  # resumed: already complete
    assert again.exit_code == 0, again.output[-2000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["kept"] == 12
    assert len(out.read_text().splitlines()) == 12
    lines = out.read_text().splitlines(keepends=True)  # killed while appending task 12: its line cut short,
    out.write_bytes("".join(lines[:11]).encode() + "Ö".encode()[:1])  # inside a character
    mended = cli(*command)
    assert mended.exit_code == 0, mended.output[-2000:]
    assert json.loads(mended.stdout.strip().splitlines()[-1])["kept"] == 12
    assert [SearchTask.model_validate_json(line) for line in out.read_text().splitlines()][:11] == tasks[:11]
    out.write_text("".join(lines[:3]) + '{"id": 5}\n' + "".join(lines[4:11]))  # a bad line inside: named, not mended
    bad = cli(*command)
    assert bad.exit_code == 2 and "tasks.jsonl: line 4" in bad.stderr, bad.output[-2000:]
    for hops in ("1,x", "4"):
        wrong = cli(*command[:8], hops, *command[9:])
        assert wrong.exit_code == 2 and f"--hops {hops}: comma-separated 1, 2 or 3" in wrong.stderr, wrong.output
    (tmp_path / "mine.jsonl").write_text('{"id": "hand-made"}\n')  # a user's own file is never overwritten
    refused = cli(*command[:4], tmp_path / "mine.jsonl", *command[5:])
    assert refused.exit_code == 2 and "not ours to resume" in refused.stderr
    assert (tmp_path / "mine.jsonl").read_text() == '{"id": "hand-made"}\n'
    docs = corpus.read_text().splitlines(keepends=True)
    corpus.write_text("".join(docs) + docs[1])  # a document twice: its quotes and splits would be ambiguous
    twice = cli(*command)
    assert twice.exit_code == 2 and f"document id {_corpus()[1].id!r} on lines 2 and {len(docs) + 1}" in twice.stderr


def _scripted_generator() -> FastAPI:
    """A real HTTP endpoint speaking the chat completions API, cycling through four kinds of reply."""
    app, kinds = FastAPI(), itertools.cycle(["good", "malformed", "hallucinated", "leaking", "lines"])

    @app.post("/v1/chat/completions")
    async def complete(body: dict) -> dict:
        prompt = body["messages"][0]["content"]
        doc_id, title, body_text = re.search(r"\[(\S+)\] (.*)\n(.*(?:\n(?!\n).*)*)", prompt).groups()
        line = next(
            (x for x in body_text.splitlines() if ":" in x and not x.startswith("{")), body_text.splitlines()[0]
        )
        key, _, value = line.partition(":")
        kind = next(kinds)
        reply = {
            "good": {"question": f"What is the {key.lower()} of {title}?", "answer": value.strip(),
                     "quotes": [{"doc_id": doc_id, "text": line}]},
            "hallucinated": {"question": f"What is the {key.lower()} of {title}?", "answer": "Atlantis",
                             "quotes": [{"doc_id": doc_id, "text": f"{key}: Atlantis"}]},
            "leaking": {"question": f"Is {value.strip()} the {key.lower()} of {title}?", "answer": value.strip(),
                        "quotes": [{"doc_id": doc_id, "text": line}]},
        }.get(kind)  # fmt: skip
        content = json.dumps(reply) if reply else "Sure! Here is a question about the documents."
        if kind == "lines":  # the line format small models manage better than JSON
            content = (
                f"Question: Which {key.lower()} does {title} have?\nAnswer: {value.strip()}\nQuote [{doc_id}]: {line}"
            )
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}]}  # fmt: skip

    return app


def test_llm_generator_failures_are_dropped_with_their_reasons(tmp_path):
    docs = [d for d in _corpus() if not d.text.startswith("{")]
    with BackgroundServer(_scripted_generator()) as server:
        writer = taskgen.LLMWriter(taskgen.GeneratorConfig(base_url=server.base_url + "/v1"))
        index = SearchIndex(docs, tmp_path / "index")
        run = taskgen.generate(docs, index, writer, count=50, hops=[1], out=tmp_path / "t.jsonl", max_attempts=15)
    assert run.attempts == 15 and any(t.question.startswith("Which") for t in run.kept)  # the line format too
    assert run.dropped["malformed_output"] == 3 and run.dropped["quote_not_in_source"] == 3
    assert run.dropped["answer_in_question"] == 3
    assert len(run.kept) + sum(run.dropped.values()) == 15  # the good ones kept, or dropped for a reason


def test_demonstrations_are_filtered_by_recall_with_capped_negatives():
    from harnessrl.envs.search.reward import DemoFilter, filter_demonstrations
    from harnessrl.types import Episode, Outcome, Task

    def demo(seen: list[str], returned: list[str]) -> Episode:
        info = {"trajectory_doc_ids": seen, "doc_ids": returned}
        return Episode(task=Task(data={"gold_doc_ids": ["a", "b"]}), outcome=Outcome(info=info))

    good = [demo(["a", "b"], ["a"]) for _ in range(20)]  # trajectory 1.0, output 0.5
    seen_only = [demo(["a", "b"], []) for _ in range(5)]  # output 0 < 0.4
    weak = [demo(["a"], ["a"]) for _ in range(5)]  # trajectory 0.5, not above 0.5
    zero = [demo(["x"], ["y"]) for _ in range(10)]
    kept, counts = filter_demonstrations(good + seen_only + weak + zero, DemoFilter())
    assert counts == {"episodes": 40, "above_trajectory_recall": 25, "above_both": 20, "zero_recall": 10,
                      "negatives_kept": 1, "kept": 21}  # fmt: skip
    assert kept[:20] == good and kept[20] is zero[0]


def test_generated_tasks_train_the_search_job(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(d.model_dump_json() + "\n" for d in _corpus()))
    made = cli("tasks", "--corpus", corpus, "--out", tmp_path / "tasks.jsonl", "--count", "16", "--test-share", "0.3")
    assert made.exit_code == 0, made.output[-2000:]
    (tmp_path / "job.yaml").write_text(
        "model: tiny\neval_tasks: 2\neval_repeats: 1\nagent: {max_turns: 2, max_tokens: 16}\n"
        "sft: {steps: 1, batch_episodes: 4, filter: {trajectory_recall: 0.0, output_recall: 0.0}}\n"
        "rl: {updates: 1, validation_tasks: 2, validation_repeats: 1, validate_every: 1,\n"
        "     rollout: {group_size: 2, groups_per_update: 1, staleness: 0}}\n"
    )
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "harnessrl", "train", str(tmp_path / "job.yaml"), "--corpus", str(corpus),
         "--tasks", str(tmp_path / "tasks.jsonl"), "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads((out / "sft" / "filter.json").read_text())
    assert counts["kept"] == counts["above_both"] + counts["negatives_kept"] and counts["episodes"] > 0
    assert "heldout_success_after" in json.loads((out / "summary.json").read_text())


async def test_audit_scores_answerability_with_a_judge():
    from harnessrl.envs.search.data import Quote
    from harnessrl.rewards.judge import Judge, JudgeConfig

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def judge(body: dict) -> dict:
        prompt = body["messages"][-1]["content"]
        content = (
            "no idea"
            if "Corrin" in prompt
            else json.dumps({"scores": [{"id": 0, "score": 0.0 if "Atlantis" in prompt else 1.0}]})
        )
        return {"id": "j", "object": "chat.completion", "created": 0, "model": "judge",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}  # fmt: skip

    def task(town: str, answer: str) -> SearchTask:
        quote = Quote(doc_id="d", text=f"Mayor: {answer}")
        return SearchTask(id=town, question=f"Who is the mayor of {town}?", answer=answer, gold_doc_ids=["d"],
                          split="train", quotes=[quote])  # fmt: skip

    items = [task("Arlen", "Mara Quell"), task("Bexby", "Atlantis"), task("Corrin", "Ilse Dorn")]
    with BackgroundServer(app) as server:
        config = JudgeConfig(base_url=server.base_url + "/v1", retries=0, rubric=taskgen.ANSWERABLE)
        result = await taskgen.answerability(items, Judge(config))
    assert result == {"judged": 2, "judge_failures": 1, "answerable_share": 0.5}
    unreachable = JudgeConfig(base_url="http://127.0.0.1:9/v1", retries=0, timeout=2, rubric=taskgen.ANSWERABLE)
    nothing = await taskgen.answerability(items, Judge(unreachable))  # no share: it was 0.0, "none answerable"
    assert nothing == {"judged": 0, "judge_failures": 3, "answerable_share": None}


def test_rule_generator_chains_three_hops(tmp_path):
    docs = _corpus()
    run = taskgen.generate(docs, SearchIndex(docs, tmp_path / "index"), taskgen.RuleWriter(docs), count=3,
                           hops=[3], out=tmp_path / "t.jsonl", test_share=0.0)  # fmt: skip
    by_id = {d.id: d for d in docs}
    assert len(run.kept) == 3 and run.hops == {"3": 3}
    for task in run.kept:  # town -> its mayor -> the mayor's hometown: three documents, each quoted verbatim
        assert len(set(task.gold_doc_ids)) == 3 and task.question.count(" of the ") == 2
        assert all(taskgen.quote_found(q.text, by_id[q.doc_id].text) for q in task.quotes)


def _write_corpus(path, docs: list[Doc]):
    path.write_text("".join(d.model_dump_json() + "\n" for d in docs))
    return path


def test_an_out_that_cannot_be_written_or_a_corpus_without_words_is_a_clean_error(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _corpus())
    for out, why in ((tmp_path / "missing" / "tasks.jsonl", "No such file or directory"), (tmp_path, "Is a directory")):
        done = cli("tasks", "--corpus", corpus, "--out", out, "--count", "1")
        assert done.exit_code == 2 and f"--out {out}: {why}" in done.stderr, done.output[-2000:]
    wordless = _write_corpus(tmp_path / "wordless.jsonl", [Doc(id="x", text="!!!"), Doc(id="y", text="? a")])
    done = cli("tasks", "--corpus", wordless, "--out", tmp_path / "t.jsonl", "--count", "1")
    assert done.exit_code == 2 and f"{wordless}: no document has a word to search by" in done.stderr, done.output
    early = cli("tasks", "--corpus", wordless, "--out", tmp_path / "missing" / "t.jsonl")  # --out: before the index
    assert early.exit_code == 2 and f"--out {tmp_path / 'missing' / 't.jsonl'}: No such file" in early.stderr


def test_a_resumed_run_must_have_the_first_runs_settings(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _corpus())
    out, progress = tmp_path / "tasks.jsonl", tmp_path / "tasks.jsonl.progress.json"
    command = ["tasks", "--corpus", corpus, "--out", out, "--count", "3", "--test-share", "0.3"]
    assert cli(*command).exit_code == 0
    made = out.read_text()
    changed = cli(*command[:-1], "0.5")  # test tasks' answer documents would turn up in training tasks
    assert changed.exit_code == 2 and "(test_share: 0.3 then, 0.5 now)" in changed.stderr, changed.output
    changed = cli(*command, "--hops", "1,2", "--seed", "1")
    assert changed.exit_code == 2 and "(hops: [1] then, [1, 2] now; seed: 0 then, 1 now)" in changed.stderr
    _write_corpus(corpus, _corpus()[1:])
    changed = cli(*command)
    assert changed.exit_code == 2 and "(corpus_sha256: " in changed.stderr, changed.output
    assert out.read_text() == made
    _write_corpus(corpus, _corpus())
    state = json.loads(progress.read_text())
    progress.write_text(json.dumps({k: v for k, v in state.items() if k != "settings"}))  # an older harnessrl's
    old = cli(*command)
    assert old.exit_code == 2 and "records no settings" in old.stderr and out.read_text() == made
    out.write_text("")  # stopped before its first attempt: nothing to mix, so other settings start afresh
    progress.write_text(json.dumps({"attempts": 0, "dropped": {}, "hops": {}, "settings": state["settings"]}))
    fresh = cli(*command[:-1], "0.5")
    assert fresh.exit_code == 0, fresh.output[-2000:]
    assert json.loads(progress.read_text())["settings"]["test_share"] == 0.5


def test_a_task_whose_answer_documents_are_on_both_sides_of_the_split_is_dropped(tmp_path):
    share = 0.5
    test_doc = next(f"a{i}" for i in range(100) if taskgen.doc_split(f"a{i}", share) == "test")
    train_doc = next(f"b{i}" for i in range(100) if taskgen.doc_split(f"b{i}", share) == "train")
    docs = [Doc(id=test_doc, title="Alpha", text="Maintainer: Bob Smith"),
            Doc(id=train_doc, title="Bob Smith", text="Employer: Smith\nCity: Leeds"),
            *(Doc(id=f"f{i}", title=f"Filler {i}", text="nothing here") for i in range(3))]  # fmt: skip
    run = taskgen.generate(docs, SearchIndex(docs, tmp_path / "index"), taskgen.RuleWriter(docs), count=10,
                           hops=[1, 2], out=tmp_path / "t.jsonl", test_share=share, max_attempts=200)  # fmt: skip
    # "Smith" is in both quotes: the test document's "Bob Smith" and the train document's employer
    assert "What is the employer of the maintainer of Alpha?" not in {t.question for t in run.kept}
    assert run.dropped["crosses_split"] and run.kept
    for task in run.kept:
        answer_docs = {q.doc_id for q in task.quotes if taskgen.contains(q.text, task.answer)}
        assert {taskgen.doc_split(d, share) for d in answer_docs} == {task.split}


def test_a_title_two_documents_share_makes_no_question_and_no_hop(tmp_path):
    """Two Springfields: "What is the population of Springfield?" has two answers, and the other one passed as a
    distractor (it lacks this answer)."""
    docs = [Doc(id="spr-il", title="Springfield", text="State: Illinois\nPopulation: 114394"),
            Doc(id="spr-ma", title="Springfield", text="State: Massachusetts\nPopulation: 155929"),
            Doc(id="ann", title="Ann Lee", text="Birthplace: Springfield\nTrade: baker"),
            *(Doc(id=f"t{i}", title=f"Town {i}", text=f"State: Ohio\nPopulation: {1000 + i}") for i in range(4))]  # fmt: skip
    run = taskgen.generate(docs, SearchIndex(docs, tmp_path / "index"), taskgen.RuleWriter(docs), count=20,
                           hops=[1, 2], out=tmp_path / "t.jsonl", test_share=0.0, max_attempts=200)  # fmt: skip
    assert run.kept and run.dropped["ambiguous_title"]
    assert not [
        t.question for t in run.kept if "Springfield" in t.question or {"spr-il", "spr-ma"} & set(t.gold_doc_ids)
    ]


def test_fact_keys_in_any_script_and_json_values_as_written():
    doc = Doc(id="m", title="Москва", text="Столица: да\nΠληθυσμός: 12000000\nÉtat: libre\n1st: no\n_x: no")
    assert [key for key, _, _ in taskgen.facts(doc)] == ["Столица", "Πληθυσμός", "État"]
    record = {"motto": 'say "hi"', "active": True, "ratio": 1.5, "rank": 3, "tags": ["a"], "name": "Zed"}
    doc = Doc(id="r", title="R", text=json.dumps(record))
    found = taskgen.facts(doc)
    assert [(key, value) for key, value, _ in found] == [
        ("motto", 'say "hi"'), ("active", "true"), ("ratio", "1.5"), ("rank", "3"), ("name", "Zed")
    ]  # fmt: skip
    assert all(taskgen.quote_found(quote, doc.text) for _, _, quote in found)


def test_answers_are_compared_as_whole_words():
    docs = {"d": Doc(id="d", text="Status: nova\nVerdict: no")}

    def verified(question: str, answer: str, quote: str) -> str | None:
        return taskgen.verify(taskgen.Draft(question, answer, [Quote(doc_id="d", text=quote)], 1), docs, set())

    assert verified("Is the status nova?", "no", "Verdict: no") is None  # "no" is not in "nova"
    assert verified("What is the verdict?", "no", "Status: nova") == "answer_not_in_quotes"
    assert verified("Is the verdict no?", "no", "Verdict: no") == "answer_in_question"


def test_judge_without_audit_and_generation_flags_with_audit_are_refused(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _corpus())
    (tmp_path / "judge.yaml").write_text("not: [valid")
    alone = cli("tasks", "--corpus", corpus, "--judge", tmp_path / "judge.yaml", "--count", "1", "--max-attempts", "1")
    assert alone.exit_code == 2 and "--judge: scores the tasks of --audit" in alone.stderr, alone.output[-2000:]
    task = SearchTask(id="t", question="When was Arlen founded?", answer="1700", gold_doc_ids=["town-0"], split="train")
    (tmp_path / "tasks.jsonl").write_text(task.model_dump_json() + "\n")
    mixed = cli("tasks", "--corpus", corpus, "--audit", tmp_path / "tasks.jsonl", "--count", "5", "--seed", "0")
    assert mixed.exit_code == 2 and "--count, --seed: for generating tasks, not with --audit" in mixed.stderr


def test_audit_fails_what_train_would_refuse_or_what_does_not_add_up():
    docs = _corpus()
    good = SearchTask(id="t", question="When was Arlen founded?", answer="1700", gold_doc_ids=["town-0"],
                      split="train", quotes=[Quote(doc_id="town-0", text="Founded: 1700")],
                      distractor_doc_ids=["town-1"])  # fmt: skip
    tasks = [
        good,
        good.model_copy(update={"gold_doc_ids": ["town-0", "nowhere"]}),
        good.model_copy(update={"quotes": [*good.quotes, Quote(doc_id="town-1", text="Founded: 1713")]}),
        good.model_copy(update={"distractor_doc_ids": ["town-1", "nowhere"]}),
    ]
    report = taskgen.audit(tasks, docs)
    assert report["passed"] == 1 and report["failed"] == {
        "gold_unknown_document": 1, "quote_outside_gold": 1, "distractor_unknown_document": 1
    }  # fmt: skip


def test_chosen_llm_replies_parse_or_drop_as_malformed(tmp_path):
    """A quote with a key beyond doc_id and text, a quote id holding "]", and a reply with no choices."""
    replies = iter([
        json.dumps({"question": "Who is the mayor of Arlen?", "answer": "Mara Quell",
                    "quotes": [{"doc_id": "town[0]", "text": "Mayor: Mara Quell", "doc_title": "Arlen"}]}),
        "Question: Who is the mayor of Arlen?\nAnswer: Mara Quell\nQuote [town[0]]: Mayor: Mara Quell",
        None,
    ])  # fmt: skip
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(body: dict) -> dict:
        content = next(replies)
        choices = [] if content is None else [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": content}}]  # fmt: skip
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"], "choices": choices}

    seed = Doc(id="town[0]", title="Arlen", text="Arlen is a river town.\nMayor: Mara Quell")
    with BackgroundServer(app) as server:
        writer = taskgen.LLMWriter(taskgen.GeneratorConfig(base_url=server.base_url + "/v1"))
        drafts = [writer.write(seed, [], 1, None) for _ in range(3)]
    assert (
        drafts[0]
        == drafts[1]
        == taskgen.Draft(
            "Who is the mayor of Arlen?", "Mara Quell", [Quote(doc_id="town[0]", text="Mayor: Mara Quell")], 1
        )
    )
    assert drafts[2] == "malformed_output"


def test_a_document_titled_with_the_answer_is_no_distractor(tmp_path):
    """Records whose text never names their subject: the mayor Mara Quell's own record, titled "Mara Quell", was
    picked as a distractor "without the answer" of "What is the mayor of Arlen?", and the audit passed it."""
    towns, people = TOWNS[:4], PEOPLE[:4]
    docs = [
        Doc(id=f"town-{i}", title=t, text=f"Mayor: {people[i]}\nFounded: {1700 + 13 * i}") for i, t in enumerate(towns)
    ]
    docs += [Doc(id=f"person-{i}", title=p, text=json.dumps({"born": str(1950 + i), "hometown": towns[(i + 1) % 4]}))
             for i, p in enumerate(people)]  # fmt: skip
    index = SearchIndex(docs, tmp_path / "chroma")
    writer, out = taskgen.RuleWriter(docs), tmp_path / "tasks.jsonl"
    run = taskgen.generate(docs, index, writer, 12, [1], out, test_share=0.0, distractors=8)  # every one that may be
    assert len(run.kept) == 12 and any(t.answer in people for t in run.kept)
    by_id = {d.id: d for d in docs}
    for task in run.kept:
        assert task.distractor_doc_ids and all(task.answer not in f"{by_id[d].title} {by_id[d].text}"
                                               for d in task.distractor_doc_ids), task  # fmt: skip
    mayor = run.kept[0].model_copy(update={"question": "What is the mayor of Arlen?", "answer": "Mara Quell",
        "gold_doc_ids": ["town-0"], "quotes": [Quote(doc_id="town-0", text="Mayor: Mara Quell")],
        "distractor_doc_ids": ["person-0"]})  # fmt: skip
    assert taskgen.audit([mayor], docs)["failed"] == {"distractor_contains_answer": 1}
