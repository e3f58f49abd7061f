import asyncio
import json

import pytest
from pydantic import ValidationError

from harnessrl.envs.search import Doc, SearchAgent, SearchIndex, context1_reward, synthetic
from harnessrl.envs.search.errors import ERROR_CLASSES, error_class
from harnessrl.envs.search.harness import _Run
from harnessrl.envs.search.reward import f_beta
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.job.config import JobConfig
from harnessrl.policy import Policy
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.types import Call, Episode, Outcome, Task


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    docs, tasks = synthetic(0)
    return SearchIndex(docs, tmp_path_factory.mktemp("chroma")), tasks


def test_tools_show_new_chunks_prune_deletes_them_and_the_budget_is_enforced(index):
    idx, tasks = index
    run = _Run(SearchAgent(idx, context_budget=100), tasks[2].task())
    first = run.search_corpus(tasks[2].question)
    ids = [line.split("]")[0][1:] for line in first.splitlines()]
    assert len(ids) == 3 and all(i in run.shown for i in ids)
    again = [line.split("]")[0][1:] for line in run.search_corpus(tasks[2].question).splitlines()]
    assert not set(ids) & set(again)
    run.messages = [{"role": "tool", "content": first}]
    assert run.prune_chunks([ids[0], "never-shown#0"]) == 'pruned 1; not in context: ["never-shown#0"]'
    assert run.prune_chunks([ids[0], ids[0]]) == f'pruned 0; not in context: ["{ids[0]}"]'  # pruned already: named once
    assert f"[{ids[0]}]" not in run.messages[0]["content"] and f"[{ids[1]}] " in run.messages[0]["content"]
    run.messages.append({"role": "tool", "content": run.read_document("person-2")})
    assert run.messages[1]["content"].startswith("[person-2] ") and "person-2" in run.seen_docs
    assert "person-2#0" in run.shown  # a document read is excluded from later searches
    assert run.prune_chunks(["person-2"]) == "pruned 1" and run.messages[1]["content"] == ""
    doc = ids[1].split("#")[0]  # a document id also drops its chunks shown by a search
    assert run.prune_chunks([doc]) == "pruned 1" and f"[{ids[1]}]" not in run.messages[0]["content"]
    assert run.read_document("nope").startswith("error:")
    run.used = 60  # over half: the four oldest chunks still in context, in the order they were shown
    shown = [*ids, *again, *(c.id for c in idx.chunks_of("person-2"))]
    left = [c for c in shown if c != ids[0] and c.split("#")[0] not in {"person-2", doc}]
    assert f"consider prune_chunks({json.dumps(left[:4])})" in run._usage()
    run.used = 100
    assert "only prune_chunks and answer" in run._usage()


def test_a_document_read_whole_is_pruned_whole_and_its_id_may_hold_a_hash(tmp_path):
    docs = [
        Doc(id="page#History", title="History", text="Founded in 1901 by Ada.\n\nMoved to Oslo in 1950.\n[1] Notes."),
        Doc(id="other", text="Nothing to see " + "a" * 40 + "b. " + "more words here " * 30),
    ]
    idx = SearchIndex(docs, tmp_path / "chroma")
    run = _Run(SearchAgent(idx, context_budget=100), Task(id="t", prompt="When?", data={"answer": "1901"}))
    run.messages.append({"role": "tool", "content": f"{run.read_document('page#History')}\n{run._usage()}"})
    assert "Moved to Oslo" in run.messages[-1]["content"]
    assert run.prune_chunks(["page#History"]) == "pruned 1"
    assert run.messages[-1]["content"] == run._usage()  # every paragraph gone, the usage line kept
    run.used = 60  # over half: nothing of the pruned document is suggested for pruning again
    assert "consider prune_chunks([])" in run._usage()
    again = run.read_document("page#History")  # read again: in context again, and prunable again
    run.messages.append({"role": "tool", "content": again})
    assert run.prune_chunks(["page#History#0"]) == "pruned 1" and again not in run.messages[-1]["content"]
    run.messages.append({"role": "tool", "content": run.read_document("other")})  # two chunks (80 words each)
    assert len(idx.chunks_of("other")) == 2
    assert run.prune_chunks(["other#0"]) == 'pruned 1; ["other#0"] stay inside ["other"], read whole: prune those ids'
    assert run.messages[-1]["content"].startswith("[other] ")  # a chunk named is not a document gone
    assert run.prune_chunks(["other#1"]) == "pruned 1" and run.messages[-1]["content"] == ""  # its last chunk: gone
    # a backtracking pattern (re would hold the GIL for hours, past any tool timeout) is a tool error in seconds
    with pytest.raises(ValueError, match=r"the pattern took over 2(\.\d+)? s"):
        idx.grep(r"\b(a|aa)+\b\.", k=5)
    # an id that is another document's chunk id: prune_chunks("manual#1") would drop both
    with pytest.raises(
        ValueError, match="c.jsonl: document id 'other#1' is also the id of a chunk of document 'other'"
    ):
        SearchIndex([*docs, Doc(id="other#1", text="A page of its own.")], tmp_path / "clash", source="c.jsonl")


def test_pruning_deletes_only_the_entries_it_names_whatever_a_documents_lines_look_like(tmp_path):
    docs = [
        Doc(id="1", text="Ada founded it.\n[2] Smith, 1990.\nIt moved to Oslo in 1950.\n[context: a quote] and on."),
        Doc(id="2", text="Smith wrote a book about the history of Oslo"),
        Doc(id="a]b", text="An id with a bracket in it"),
    ]
    idx = SearchIndex(docs, tmp_path / "chroma")
    run = _Run(SearchAgent(idx, context_budget=100), Task(id="t", prompt="When?", data={"answer": "1950"}))
    for result in (run.grep_corpus("Smith wrote"), run.read_document("1"), run.read_document("a]b")):
        run.messages.append({"role": "tool", "content": f"{result}\n{run._usage()}"})
    assert run.prune_chunks(["2"]) == "pruned 1"  # its chunk's entry goes; document 1's footnote line is its text
    assert run.messages[-3]["content"] == run._usage() and "It moved to Oslo in 1950." in run.messages[-2]["content"]
    assert run.prune_chunks(["1", "a]b"]) == "pruned 2"  # every line of each, footnote and quoted usage line too
    assert [m["content"] for m in run.messages[-2:]] == [run._usage()] * 2


def test_a_document_pruned_by_its_id_is_prunable_again_when_a_search_brings_more_of_it(tmp_path):
    docs = [Doc(id="a", title="Alpha", text=" ".join(f"w{i}" for i in range(200))), Doc(id="b", text="other words")]
    idx = SearchIndex(docs, tmp_path / "chroma")
    run = _Run(SearchAgent(idx, context_budget=100), Task(id="t", prompt="Which?", data={"answer": "w7"}))
    run.messages.append({"role": "tool", "content": f"{run.grep_corpus('w1 ')}\n{run._usage()}"})
    assert run.prune_chunks(["a"]) == "pruned 1" and run.messages[-1]["content"] == run._usage()
    run.messages.append({"role": "tool", "content": f"{run.grep_corpus('w150')}\n{run._usage()}"})
    assert run.messages[-1]["content"].startswith("[a#1] ")
    usage, run.used = run._usage(), 60  # over half: the chunk back in context is suggested, the one pruned before not
    assert 'consider prune_chunks(["a#1"])' in run._usage()
    assert run.prune_chunks(["a"]) == "pruned 1" and run.messages[-1]["content"] == usage


def test_context1_reward_by_hand():
    assert f_beta({"a", "b"}, {"a"}, beta=1.0) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f_beta({"x"}, {"a"}, beta=4.0) == 0.0
    reward = context1_reward(anneal_steps=100)
    e = Episode(calls=[Call(prompt_ids=[1], completion_ids=[2], sampled_logprobs=[0.0], policy_version=0)],
                outcome=Outcome(answer="Venzel", success=True, info={"doc_ids": ["a", "b"], "trajectory_doc_ids": ["a", "c"], "max_prune_streak": 3}))  # fmt: skip
    e.task.data = {"gold_doc_ids": ["a"]}
    early, late = reward.score(e, step=0), reward.score(e, step=100)
    assert early.terms["f_beta"] == pytest.approx(0.7 * f_beta({"a", "b"}, {"a"}, 4.0))
    assert late.terms["f_beta"] == pytest.approx(0.7 * f_beta({"a", "b"}, {"a"}, 2.0))
    assert early.terms["trajectory_recall"] == 0.3 and early.terms["answer_bonus"] == 1.0
    assert early.terms["prune_streak"] == pytest.approx(-0.1) and early.terms["turns"] == 0.0
    # the job config's reward: block sets the weights; an unknown key is refused, naming it
    weighed = JobConfig.model_validate({"reward": {"f_beta": 0.0, "trajectory_recall": 0.5, "anneal_steps": 100}})
    terms = weighed.reward.build().score(e, step=0).terms
    assert terms["f_beta"] == 0.0 and terms["trajectory_recall"] == 0.5 and terms["answer_bonus"] == 1.0
    # a detector's weight too: at 0 it still flags the episode and costs nothing
    stuffed = e.model_copy(deep=True)
    stuffed.outcome.info["doc_ids"] = ["a", "b", "c", "d"]  # one gold document among four cited
    on, off = (
        JobConfig.model_validate({"reward": r}).reward.build().score(stuffed) for r in ({"answer_stuffing": 0.3}, {})
    )
    assert on.terms["answer_stuffing"] < 0 and off.terms["answer_stuffing"] == 0.0
    assert "answer_stuffing" in on.flags and "answer_stuffing" in off.flags
    assert off.total == pytest.approx(on.total - on.terms["answer_stuffing"])
    # the job's default is the outcome: Context-1's retrieval terms are logged at weight 0
    outcome = JobConfig().reward.build().score(stuffed, step=0)
    assert outcome.terms["f_beta"] == outcome.terms["trajectory_recall"] == outcome.terms["turns"] == 0.0
    assert outcome.terms["answer_bonus"] == 1.0 and outcome.terms["prune_streak"] == pytest.approx(-0.1)
    assert outcome.values["f_beta"] == pytest.approx(f_beta({"a", "b", "c", "d"}, {"a"}, 4.0))  # watched, not paid
    assert outcome.values["trajectory_recall"] == 1.0 and outcome.total == pytest.approx(1.0 - 0.1)
    with pytest.raises(ValidationError, match="reward.f_bta"):
        JobConfig.model_validate({"reward": {"f_bta": 0.0}})


def test_an_episode_of_the_search_agent_through_the_rollout_engine(index):
    idx, tasks = index
    policy = Policy.load("tiny")
    try:
        gateway = GatewayClient("search-admin-key", app=create_app(policy, "search-admin-key"))
        engine = RolloutEngine(
            gateway, SearchAgent(idx, max_turns=3, max_tokens=16), context1_reward(), RolloutConfig(group_size=2)
        )
        group = asyncio.run(engine.group(tasks[0].task()))
    finally:
        policy.close()
    for e in group:
        assert e.status == "finished" and len(e.calls) == 3 and e.outcome.info["turns"] == 3
        assert set(e.reward.terms) >= {"f_beta", "trajectory_recall", "answer_bonus", "turns", "malformed_tool_calls"}


def test_the_expert_records_token_exact_demonstrations_through_the_gateway(index):
    from harnessrl.envs.search.expert import SearchExpert
    from harnessrl.train.sequences import episode_sequences

    idx, tasks = index
    policy = Policy.load("tiny")
    try:
        gateway = GatewayClient("expert-admin-key", app=create_app(policy, "expert-admin-key"))
        engine = RolloutEngine(
            gateway, SearchExpert(SearchAgent(idx, context_budget=1000)), context1_reward(), RolloutConfig(group_size=2)
        )

        async def run():
            return [await engine.group(t.task()) for t in tasks[:6]]

        groups = asyncio.run(run())
    finally:
        policy.close()
    episodes = [e for g in groups for e in g]
    assert sum(e.outcome.success for e in episodes) == len(episodes)  # it always knows the answer
    assert sum(e.reward.terms["f_beta"] > 0 for e in episodes) == len(episodes)
    for e in episodes:
        assert all(
            c.finish_reason == "tool_calls" and c.sampled_logprobs == [0.0] * len(c.completion_ids) for c in e.calls
        )
        text = policy.decode(e.calls[0].completion_ids)
        assert text.startswith('<tool_call>{"name": "search_corpus"') and text.endswith("<|im_end|>")
        for call in e.calls[1:]:
            if call.extends_call is not None:  # token-exact continuation, as the gateway records rollouts
                head = e.calls[call.extends_call]
                assert (
                    call.prompt_ids[: len(head.prompt_ids) + len(head.completion_ids)]
                    == head.prompt_ids + head.completion_ids
                )
        assert episode_sequences(e, 1.0)
    pruned = [e for e in episodes if e.outcome.info["pruned"]]
    assert pruned, "a 1000-token budget (about 700 of which are the prompt and tools) makes the expert prune"
    for e in pruned:  # pruning edits the history: the next call cannot extend the one before it
        assert any(c.extends_call != i for i, c in enumerate(e.calls[1:]))


def test_the_experts_demonstrations_answer_within_the_agents_turns_and_only_from_their_context(index, tmp_path):
    """Three-hop chains in 3 turns, and long prose documents past a 1024-token budget (the voyages corpus, where the
    expert's searches and reads were refused at the budget and it answered with facts it never saw, 22 of 40): each
    demonstration answers within the agent's turns from what its context holds, or fails saying which gold document
    it could not read (SFT leaves it out)."""
    from harnessrl.envs.search import voyages
    from harnessrl.envs.search.data import normalise
    from harnessrl.envs.search.expert import SearchExpert

    idx, tasks = index
    chains = [t.task() for t in tasks if len(t.gold_doc_ids) == 3][:4]  # search, read, prune: more than 3 turns
    docs, prose = voyages(0)
    prose_index = SearchIndex(docs, tmp_path / "voyages")
    policy = Policy.load("tiny")
    try:
        gateway = GatewayClient("expert-admin-key", app=create_app(policy, "expert-admin-key"))
        short = SearchExpert(SearchAgent(idx, context_budget=600, max_turns=3), p_distractor=1.0)
        long = SearchExpert(SearchAgent(prose_index, context_budget=1024, max_turns=6))
        config = RolloutConfig(group_size=2)
        engines = [RolloutEngine(gateway, expert, context1_reward(), config) for expert in (short, long)]

        async def run():
            return [await engines[0].episode(t) for t in chains] + [
                await engines[1].episode(t.task()) for t in [t for t in prose if t.split == "train"][:12]
            ]

        episodes = asyncio.run(run())
    finally:
        policy.close()
    answered = [e for e in episodes if e.status == "finished"]
    limits = [3] * len(chains) + [6] * 12  # the agent's turns: 3 for the chains, 6 for the prose
    assert all(len(e.calls) <= e.outcome.info["turns"] <= limit for e, limit in zip(episodes, limits) if e in answered)
    assert any(e in answered for e in episodes[len(chains) :])  # some prose ones answer
    for e in answered:  # its answer is in a tool result of its own episode, as it stood when it answered
        context = normalise(" ".join(policy.decode(e.calls[-1].prompt_ids).split("<|im_start|>tool")[1:]))
        assert e.outcome.success and normalise(e.outcome.answer) in context, e.outcome.answer
    failed = [e for e in episodes if e.status == "failed"]
    assert failed and all(
        "is not in the expert's context (gold documents unread: [" in e.failure_reason for e in failed
    )


def test_error_classes_say_why_an_episode_failed():
    docs = {d.id: d for d in [Doc(id="p", title="Ann Lee", text="Ann Lee was a baker born in 1820 in Tarn."),
                              Doc(id="t", text="Tarn is a town in Velm."), Doc(id="x", text="Bo Kai was a miller.")]}  # fmt: skip
    task = Task(
        id="q", prompt="In which country was Ann Lee born?", data={"answer": "Velm", "gold_doc_ids": ["p", "t"]}
    )
    bad_call = Call(prompt_ids=[1], completion_ids=[2], sampled_logprobs=[0.0], policy_version=0, tool_call_error="x")

    def cls(answer: str, seen: list[str], success: bool = False, calls=(), status="finished") -> str:
        info = {"doc_ids": ["p"] if answer else [], "trajectory_doc_ids": seen}
        outcome = Outcome(answer=answer, success=success, info=info)
        return error_class(Episode(task=task, calls=list(calls), outcome=outcome, status=status), docs)

    assert cls("Velm", ["p", "t"], success=True) == "ok"
    assert cls("", ["p"], status="failed") == "failed"
    assert cls("", ["p"], calls=[bad_call]) == "malformed_call" and cls("", ["p"]) == "no_answer"
    assert cls("Tarn", ["p"]) == "gold_not_seen"
    assert cls("baker", ["p", "t"]) == "wrong_field" and cls("Tarn.", ["t", "p"]) == "wrong_field"
    assert cls("miller", ["p", "t", "x"]) == "wrong_entity"
    assert cls("Velmo", ["p", "t", "x"]) == "not_in_context"
    # whole words: "Bo" is the miller's name, not the start of "born"; "Ve" is in no document
    assert cls("Bo", ["p", "t", "x"]) == "wrong_entity" and cls("Ve", ["p", "t", "x"]) == "not_in_context"
    assert set(ERROR_CLASSES) == {"ok", "failed", "malformed_call", "no_answer", "gold_not_seen", "wrong_field",
                                  "wrong_entity", "not_in_context"}  # fmt: skip


def test_the_expert_reads_only_documents_its_results_showed(tmp_path):
    """Twelve towns titled Springfield: the search for the bridge's title shows three, not the gold one, whose id the
    expert alone knows. It read that id anyway (a call the agent could never make); now it answers from what it saw,
    or fails."""
    from harnessrl.envs.search.expert import SearchExpert

    docs = [Doc(id=f"s{i}", title="Springfield", text=f"Springfield is a town with {i * 7} mills.") for i in range(12)]
    docs.append(Doc(id="p", title="Ann Lee", text="Ann Lee was a baker born in Springfield."))
    task = Task(id="q", prompt="How many mills has the birthplace of Ann Lee?", data={"answer": "77", "gold_doc_ids": ["p", "s11"]})  # fmt: skip
    policy = Policy.load("tiny")
    try:
        gateway = GatewayClient("expert-admin-key", app=create_app(policy, "expert-admin-key"))
        expert = SearchExpert(SearchAgent(SearchIndex(docs, tmp_path), context_budget=4000), p_distractor=0, p_skip=0)
        engine = RolloutEngine(gateway, expert, context1_reward(), RolloutConfig(group_size=2))
        episode = asyncio.run(engine.episode(task))
    finally:
        policy.close()
    calls = [policy.decode(c.completion_ids) for c in episode.calls]
    shown = " ".join(policy.decode(c.prompt_ids) for c in episode.calls)
    assert not [c for c in calls if '"read_document"' in c and "[s11#0]" not in shown], calls
    # the results decide (ten towns tie on BM25): s11 shown and read, or not and the demonstration failed
    assert "[s11#0]" in shown or "gold documents unread: ['s11']" in episode.failure_reason
