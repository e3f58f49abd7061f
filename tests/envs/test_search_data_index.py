import json

import pytest

from harnessrl.envs.search.data import (
    DataError,
    SearchTask,
    answers_match,
    dump_synthetic,
    load,
    read_jsonl,
    synthetic,
    write_corpus,
)
from harnessrl.envs.search.index import SearchIndex
from harnessrl.envs.search.voyages import voyages
from harnessrl.types import TraceLineError


def test_synthetic_is_deterministic_and_consistent():
    (d1, t1), (d2, t2) = synthetic(3), synthetic(3)
    assert d1 == d2 and t1 == t2 and synthetic(4)[1] != t1
    docs = {d.id: d for d in d1}
    assert {len(t.gold_doc_ids) for t in t1} == {1, 2, 3} and {t.split for t in t1} == {"train", "test"}
    for t in t1:
        assert t.answer in " ".join(docs[g].text for g in t.gold_doc_ids)


def test_jsonl_errors_name_file_line_and_field(tmp_path):
    corpus, tasks = dump_synthetic(tmp_path)
    docs, items = load(corpus, tasks)
    assert len(docs) == 172 and items[0].task().data["gold_doc_ids"] == items[0].gold_doc_ids
    lines = tasks.read_text().splitlines()
    bad = json.loads(lines[1])
    del bad["answer"]
    tasks.write_text("\n".join([lines[0], json.dumps(bad)]) + "\n")
    with pytest.raises(TraceLineError, match=r"tasks.jsonl: line 2: answer: Field required"):
        read_jsonl(tasks, SearchTask)
    tasks.write_text(json.dumps(dict(json.loads(lines[0]), gold_doc_ids=["nope"])) + "\n")
    with pytest.raises(DataError, match=r"gold_doc_ids not in the corpus: \['nope'\]"):
        load(corpus, tasks)


def test_answers_match_normalises():
    assert answers_match(" Venzel. ", "venzel") and answers_match("Baker!", "baker")
    assert not answers_match("Venzela", "Venzel") and not answers_match(None, "x")
    assert answers_match("1987.", "1987") and answers_match("1,000", "1000")  # a number's own marks stay
    assert not answers_match("314", "3.14") and not answers_match("5", "-5") and not answers_match("", "?")


def test_answers_match_keeps_numbers_apart_and_unicode_forms_together():
    # a mark between digits is part of the number, not punctuation to delete
    for wrong, gold in (("1/2", "12"), ("2-3", "23"), ("3:45", "345"), ("\u22125", "5"), ("1,2", "12")):
        assert not answers_match(wrong, gold), (wrong, gold)
    same = [("Jean-Luc Picard", "Jean Luc Picard"), ("Zu\u0308rich", "Z\u00fcrich"), ("1,000", "1 000"),
            ("Stra\u00dfe", "STRASSE"), ("\uff11\uff19\uff18\uff17", "1987"), ("\u22125", "-5"),
            ("1990\u20131995", "1990-1995"), ("1\u202f000\u202f000", "1,000,000"), ("O\u2019Brien", "O'Brien")]  # fmt: skip
    for given, gold in same:
        assert answers_match(given, gold), (given, gold)
    for given, gold in (("C", "C++"), ("C#", "C"), ("F#", "F")):  # a language's mark is part of its name
        assert not answers_match(given, gold), (given, gold)
    assert answers_match("c++", "C++") and answers_match("C#.", "C#") and answers_match("5+3", "5 3")


def test_a_task_file_with_a_repeated_id_or_an_answer_of_no_letters_is_refused(tmp_path):
    corpus, tasks = dump_synthetic(tmp_path)
    lines = tasks.read_text().splitlines()
    tasks.write_text("\n".join([lines[0], "", lines[1], lines[0]]) + "\n")  # a blank line between: lines, not rows
    with pytest.raises(DataError, match=r"task id '.+' on lines 1 and 4: ids must be unique"):
        load(corpus, tasks)
    tasks.write_text(json.dumps(dict(json.loads(lines[0]), answer="?")) + "\n")
    with pytest.raises(TraceLineError, match=r"line 1: answer: Value error, has no letter or digit"):
        load(corpus, tasks)
    tasks.write_text(json.dumps(dict(json.loads(lines[0]), question="  ")) + "\n")
    with pytest.raises(TraceLineError, match=r"line 1: question: Value error, is blank"):
        load(corpus, tasks)
    first = json.loads(lines[0])
    tasks.write_text(json.dumps(dict(first, gold_doc_ids=first["gold_doc_ids"] * 2)) + "\n")
    with pytest.raises(TraceLineError, match=r"line 1: gold_doc_ids: Value error, names '.+' twice"):
        load(corpus, tasks)
    tasks.write_text(lines[0] + "\n")
    documents = corpus.read_text().splitlines()
    corpus.write_text("\n".join([*documents, json.dumps({"id": "blank", "text": " \n "})]) + "\n")
    with pytest.raises(TraceLineError, match=rf"line {len(documents) + 1}: text: Value error, is blank"):
        load(corpus, tasks)


def test_hybrid_search_finds_gold_chunks_and_skips_shown_ones(tmp_path):
    docs, tasks = synthetic(0)
    index = SearchIndex(docs, tmp_path / "chroma")
    hits = 0
    for t in tasks[:30:3]:  # one-hop questions name the person
        found = index.search(t.question, k=5)
        hits += t.gold_doc_ids[0] in {c.doc_id for c in found}
    assert hits >= 8
    first = index.search("clockmaker", k=3)
    again = index.search("clockmaker", k=3, exclude={c.id for c in first})
    assert not {c.id for c in first} & {c.id for c in again}
    assert all("clockmaker" in c.text for c in index.grep("clockmaker", k=50))
    assert index.document("person-0").text.startswith(docs[-120].text[:10])
    reopened = SearchIndex(docs, tmp_path / "chroma")  # vectors reused from the persistent store
    assert reopened.collection.count() == len(reopened.chunks)


def test_voyages_is_a_different_corpus_with_answers_inside_prose(tmp_path):
    (d1, t1), (d2, t2) = voyages(1), voyages(1)
    assert d1 == d2 and t1 == t2 and voyages(2)[1] != t1
    docs = {d.id: d for d in d1}
    assert {len(t.gold_doc_ids) for t in t1} == {1, 2, 3} and {t.split for t in t1} == {"train", "test"}
    for t in t1:
        assert t.answer in docs[t.gold_doc_ids[-1]].text
    assert all(d.text.count("\n\n") == 2 for d in d1 if d.id.startswith("ship-"))  # paragraphs, not records
    people_names = {w for d in synthetic(1)[0] for w in (d.title or "").split()}
    assert not people_names & {w for d in d1 for w in (d.title or "").split()}
    corpus, tasks = write_corpus(tmp_path, d1, t1)
    assert load(corpus, tasks) == (d1, t1)


def test_chunks_hold_80_words_and_at_most_640_characters():
    from harnessrl.envs.search.data import Doc
    from harnessrl.envs.search.index import chunk_docs

    for docs in (synthetic(0)[0], voyages(0)[0]):  # short words: 80 a chunk, as they always were
        by_words = []
        for d in docs:
            words = d.text.split()
            for n, start in enumerate(range(0, max(1, len(words)), 80)):
                text = " ".join(words[start : start + 80])
                by_words.append((f"{d.id}#{n}", f"{d.title}: {text}" if d.title and n == 0 else text))
        assert [(c.id, c.text) for c in chunk_docs(docs)] == by_words
    chinese = "東京は日本の首都である。" * 200  # no spaces: 2400 characters, one word
    minified = json.dumps({f"k{i}": i for i in range(200)}, separators=(",", ":"))
    for text in (chinese, f"see {minified} and more"):
        chunks = chunk_docs([Doc(id="d", text=text)])
        assert len(chunks) > 1 and all(len(c.text) <= 640 for c in chunks)
        assert "".join(c.text for c in chunks).replace(" ", "") == text.replace(" ", "")  # cut, nothing lost


def test_an_index_over_documents_without_a_word_says_so(tmp_path):
    from harnessrl.envs.search.data import Doc

    with pytest.raises(ValueError, match=r"^words.jsonl: no document has a word to search by"):
        SearchIndex([Doc(id="x", text="!!!"), Doc(id="y", text="? a the")], tmp_path / "chroma", source="words.jsonl")


def test_a_query_with_no_word_in_the_corpus_ranks_by_meaning_alone(tmp_path):
    from harnessrl.envs.search.data import Doc

    docs = synthetic(0)[0]
    cat = Doc(id="cat", text="A small cat sleeps on the warm windowsill every afternoon.")
    index = SearchIndex([*docs[:80], cat, *docs[80:]], tmp_path / "chroma")
    query = "feline resting in the sun"  # no word BM25 finds: every chunk scores 0 there
    dense = index.collection.query(query_embeddings=[index.query_vector(query)], n_results=3)["ids"][0]
    assert dense[0] == "cat#0"
    # bm25s ranked the zero-score chunks too (the corpus's last first), which pushed the cat out of the top 3
    assert [c.id for c in index.search(query, k=3)] == dense


def test_more_people_than_the_generator_has_names_is_refused_not_drawn_forever(tmp_path):
    from tests.conftest import cli

    assert len(synthetic(0, people=80656)[1]) == 80656  # every name there is, each once
    with pytest.raises(ValueError, match=r"^80657 is more than the 80656 distinct names the generator has"):
        synthetic(0, people=80657)  # it looped forever looking for an unused name
    refused = cli("make-corpus", tmp_path / "big", "--people", "100000")
    assert refused.exit_code == 2 and "--people: 100000 is more than the 80656 distinct names" in refused.stderr
    assert not (tmp_path / "big").exists()
