"""The continuous-batching engine against the plain model: same logprobs, same greedy tokens."""

import asyncio
import threading
import time

import pytest
import torch

from harnessrl.policy import SamplingParams
from harnessrl.policy.engine import MIN_REUSE
from harnessrl.policy.tiny import build_tiny


def _prompts(policy, n: int) -> list[list[int]]:
    return [
        policy.encode(policy.render([{"role": "user", "content": "word " * (1 + 7 * i % 23)}], None, True))
        for i in range(n)
    ]


def _reference_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + completion])).logits[0].float(), -1)
    return logp[len(prompt) - 1 : -1].gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


async def test_batched_sampling_records_the_logprobs_the_model_assigns(policy):
    prompts = _prompts(policy, 12)
    params = [
        SamplingParams(max_tokens=8 + 5 * i, seed=i, ignore_eos=True) for i in range(12)
    ]  # rows leave at different steps
    done = await asyncio.gather(*(policy.engine.generate(p, s) for p, s in zip(prompts, params)))
    for prompt, (completion,), param in zip(prompts, done, params):
        assert len(completion.ids) == param.max_tokens and completion.finish_reason == "length"
        ref = _reference_logprobs(policy.model, prompt, completion.ids)
        assert torch.allclose(torch.tensor(completion.logprobs), ref, atol=1e-4)


async def test_greedy_in_a_batch_equals_greedy_alone(policy):
    prompts = _prompts(policy, 6)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    batched = await asyncio.gather(*(policy.engine.generate(p, greedy) for p in prompts))
    model, _ = build_tiny(seed=0)
    for prompt, (completion,) in zip(prompts, batched):
        alone = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None)
        assert completion.ids == alone[0, len(prompt) :].tolist()
        assert completion.logprobs == [0.0] * 12


async def test_a_seed_gives_the_same_tokens_whatever_shares_the_batch(policy):
    prompt = _prompts(policy, 1)[0]
    seeded = SamplingParams(max_tokens=16, seed=1234)
    alone = (await policy.engine.generate(prompt, seeded))[0]
    crowd = [policy.engine.generate(p, SamplingParams(max_tokens=30)) for p in _prompts(policy, 8)]
    together, *_ = await asyncio.gather(policy.engine.generate(prompt, seeded), *crowd)
    assert together[0].ids == alone.ids
    two = await policy.engine.generate(prompt, seeded, n=2)
    assert two[0].ids == alone.ids and two[1].ids != alone.ids  # choice i uses seed + i


async def test_a_short_request_joins_and_leaves_while_a_long_one_runs(policy):
    prompts = _prompts(policy, 2)
    long = asyncio.ensure_future(policy.engine.generate(prompts[0], SamplingParams(max_tokens=400, ignore_eos=True)))
    await asyncio.sleep(0.2)  # the long request is decoding by now
    short = await policy.engine.generate(prompts[1], SamplingParams(max_tokens=5, ignore_eos=True))
    assert not long.done(), "continuous batching: the short request must not wait for the long one"
    assert len(short[0].ids) == 5
    assert len((await long)[0].ids) == 400


async def test_stop_strings_and_eos_end_a_completion(policy):
    prompt = _prompts(policy, 1)[0]
    free = (await policy.engine.generate(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)))[0]
    text = policy.decode(free.ids)
    stop = text[10:13]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    stopped = (
        await policy.engine.generate(prompt, SamplingParams(temperature=0, max_tokens=30, stop=[stop], ignore_eos=True))
    )[0]
    assert stopped.finish_reason == "stop" and stopped.stop_text == stop
    assert stop in policy.decode(stopped.ids) and stopped.ids == free.ids[: len(stopped.ids)]
    eos_only = policy.engine.eos_ids
    policy.engine.eos_ids = {free.ids[3]}
    try:
        ended = (await policy.engine.generate(prompt, SamplingParams(temperature=0, max_tokens=30)))[0]
    finally:
        policy.engine.eos_ids = eos_only
    assert ended.finish_reason == "stop" and ended.ids[-1] == free.ids[3] and len(ended.ids) <= 4


async def test_weight_updates_bump_the_version_and_change_what_is_sampled():
    from harnessrl.policy import Policy

    p = Policy.load("tiny")
    try:
        prompt = _prompts(p, 1)[0]
        greedy = SamplingParams(temperature=0, max_tokens=10)
        before = (await p.engine.generate(prompt, greedy))[0]
        long = asyncio.ensure_future(p.engine.generate(prompt, SamplingParams(max_tokens=300, ignore_eos=True)))
        await asyncio.sleep(0.1)
        other, _ = build_tiny(seed=5)
        assert p.update_weights(other.state_dict()) == 1 and p.version == 1
        after = (await p.engine.generate(prompt, greedy))[0]
        assert before.policy_version == 0 and after.policy_version == 1
        assert after.ids != before.ids
        in_flight = (await long)[0]
        assert in_flight.policy_version == 0 and len(in_flight.ids) == 300  # finished across the update
    finally:
        p.close()


def test_a_prompt_longer_than_the_context_is_refused(policy):
    import pytest

    with pytest.raises(ValueError, match="context is 4096"):
        policy.engine.submit([1] * 5000, SamplingParams())


def test_closing_fails_pending_requests_instead_of_hanging():
    from harnessrl.policy import Policy

    p = Policy.load("tiny")
    future = p.engine.submit(_prompts(p, 1)[0], SamplingParams(max_tokens=100_000, ignore_eos=True))
    time.sleep(0.05)
    p.close()
    assert future.exception(timeout=5) is not None


def test_a_prompt_whose_prefill_fails_fails_its_request_and_spares_the_engine(policy):
    mark = policy.model.config.vocab_size - 1

    def fail(module, args):  # a forward that raises on these prompts (out of memory, a model's bug)
        if bool((args[0] == mark).any()):
            raise RuntimeError("forward failed")

    hook = policy.model.get_input_embeddings().register_forward_pre_hook(fail)
    try:
        for prompt in ([1, 2, mark], [1, 2, 3] * 300 + [mark]):  # a short prompt (whole) and a long (chunked)
            bad = policy.engine.submit(prompt, SamplingParams(max_tokens=3))
            assert isinstance(bad.exception(timeout=30), RuntimeError)  # not a request left waiting forever
    finally:
        hook.remove()
    assert policy.engine.generate_sync([1, 2, 3], SamplingParams(max_tokens=3)).ids  # the engine still serves


async def test_a_prompt_id_past_the_embedding_is_refused_and_spares_the_rows_in_flight(policy):
    import pytest

    rows = policy.model.get_input_embeddings().num_embeddings
    running = [policy.engine.submit([5, 6, 7], SamplingParams(max_tokens=40, ignore_eos=True)) for _ in range(3)]
    await asyncio.sleep(0.1)
    for bad in (rows, rows + 5, -1):  # e.g. Gemma 3's image token, which its tokenizer has and its model does not embed
        with pytest.raises(ValueError, match=f"prompt id {bad} is not one the model embeds"):
            policy.engine.submit([1, 2, bad, 3], SamplingParams(max_tokens=3))
    assert [len(f.result(timeout=30).ids) for f in running] == [40] * 3  # an IndexError in the step failed them all


async def test_a_cancelled_request_frees_its_row_and_spares_the_rest(policy):
    prompts = _prompts(policy, 2)
    survivor = asyncio.ensure_future(policy.engine.generate(prompts[0], SamplingParams(max_tokens=60, ignore_eos=True)))
    try:
        await asyncio.wait_for(
            policy.engine.generate(prompts[1], SamplingParams(max_tokens=3000, ignore_eos=True)), 0.2
        )
    except TimeoutError:
        pass
    (done,) = await survivor  # unaffected by its neighbour's cancellation
    assert len(done.ids) == 60
    await asyncio.sleep(0.1)
    assert policy.engine._rows == []  # the abandoned row stopped decoding


async def test_long_prompts_are_prefilled_in_chunks_with_the_logprobs_of_a_whole_forward():
    from harnessrl.policy import Policy

    policy = Policy.load("tiny")
    policy.engine.prefill_chunk = 64  # every prompt over 64 tokens goes in chunks, several steps each
    try:
        long = policy.encode(policy.render([{"role": "user", "content": "word " * 150}], None, True))
        short = _prompts(policy, 4)
        assert len(long) > 3 * 64 and all(len(p) <= 64 for p in short)
        params = SamplingParams(max_tokens=6, seed=1, ignore_eos=True)
        done = await asyncio.gather(*(policy.engine.generate(p, params) for p in [long, *short]))
        for prompt, (completion,) in zip([long, *short], done):
            ref = _reference_logprobs(policy.model, prompt, completion.ids)
            assert torch.allclose(torch.tensor(completion.logprobs), ref, atol=1e-4)
        assert policy.engine.active == 0
    finally:
        policy.close()


async def test_a_next_turn_is_prefilled_from_the_kept_cache_with_the_logprobs_of_a_whole_forward():
    from harnessrl.policy import Policy

    policy = Policy.load("tiny")
    engine = policy.engine
    engine.prefix_cache = 4096
    try:
        prompts = _prompts(policy, 4)  # left-padded rows of one batch, leaving at different steps
        first = await asyncio.gather(
            *(
                engine.generate(p, SamplingParams(max_tokens=30 + 3 * i, seed=i, ignore_eos=True))
                for i, p in enumerate(prompts)
            )
        )
        tool = policy.encode(" the tool said: Halkamir, a country of the north")
        turns = [p + c.ids + tool for p, (c,) in zip(prompts, first)]  # an agent's next turn extends the last
        second = await asyncio.gather(*(engine.generate(t, SamplingParams(max_tokens=6, seed=9)) for t in turns))
        assert engine.prefix_hits == 4
        assert engine.prefix_tokens_reused == sum(len(p) + len(c.ids) - 1 for p, (c,) in zip(prompts, first))
        for turn, (completion,) in zip(turns, second):
            ref = _reference_logprobs(policy.model, turn, completion.ids)
            assert torch.allclose(torch.tensor(completion.logprobs), ref, atol=1e-4)
        # a prompt sharing only its first 40 tokens with every kept entry reuses those 40
        other = max(prompts, key=len)[:40] + policy.encode("zebra quux")
        reused = engine.prefix_tokens_reused
        (completion,) = await engine.generate(other, SamplingParams(max_tokens=4, seed=3))
        assert engine.prefix_tokens_reused - reused == 40
        assert torch.allclose(
            torch.tensor(completion.logprobs), _reference_logprobs(policy.model, other, completion.ids), atol=1e-4
        )
        # new weights: the kept keys and values are the old weights', so none is used again
        policy.update_weights(build_tiny(seed=5)[0].state_dict())
        hits = engine.prefix_hits
        (completion,) = await engine.generate(turns[0], SamplingParams(max_tokens=4, seed=3))
        assert engine.prefix_hits == hits
        assert torch.allclose(
            torch.tensor(completion.logprobs), _reference_logprobs(policy.model, turns[0], completion.ids), atol=1e-4
        )
        engine.prefix_cache = 8  # a budget smaller than any row keeps nothing
        engine._prefixes.clear()
        await engine.generate(prompts[1], SamplingParams(max_tokens=2))
        assert not engine._prefixes
    finally:
        policy.close()


def test_a_transformers_below_the_floor_is_refused_by_name():
    from harnessrl.policy.engine import TRANSFORMERS_NEEDED, check_transformers

    check_transformers("5.25.0")
    check_transformers(TRANSFORMERS_NEEDED)
    with pytest.raises(ImportError, match=r"transformers>=5\.24 .* has 5\.17\.0"):
        check_transformers("5.17.0")


async def test_rows_done_at_their_first_token_leave_the_batch_and_keep_their_prefix():
    from harnessrl.policy import Policy

    policy = Policy.load("tiny")
    engine = policy.engine
    engine.prefix_cache = 4096
    try:
        prompts = _prompts(policy, 8)
        long = asyncio.ensure_future(
            engine.generate(prompts[0], SamplingParams(max_tokens=300, seed=1, ignore_eos=True))
        )
        kept = [p for p in prompts if len(p) > MIN_REUSE]  # shorter ones are prefilled whole, never from the cache
        await asyncio.sleep(0.2)  # decoding: the one-token rows join its batch and leave it at once
        first = await asyncio.gather(
            *(engine.generate(p, SamplingParams(max_tokens=1, seed=i)) for i, p in enumerate(kept))
        )
        tool = policy.encode(" the tool said: Halkamir")
        turns = [p + c.ids + tool for p, (c,) in zip(kept, first)]
        second = await asyncio.gather(*(engine.generate(t, SamplingParams(max_tokens=5, seed=7)) for t in turns))
        assert engine.prefix_hits == len(kept) == 4  # each kept its prompt's KV (its one token was never fed)
        assert engine.prefix_tokens_reused == sum(map(len, kept))
        ran_on = await long
        assert len(ran_on[0].ids) == 300
        for prompt, (completion,) in [*zip(turns, second), (prompts[0], ran_on)]:
            ref = _reference_logprobs(policy.model, prompt, completion.ids)
            assert torch.allclose(torch.tensor(completion.logprobs), ref, atol=1e-4)
    finally:
        policy.close()


def test_a_finished_row_riding_along_leaves_its_slot_to_a_waiting_request():
    from harnessrl.policy import Policy

    policy = Policy.load("tiny", max_batch=10)
    engine = policy.engine
    try:
        prompt = _prompts(policy, 1)[0]
        longs = [engine.submit(prompt, SamplingParams(max_tokens=200, ignore_eos=True)) for _ in range(9)]
        # the last to join, so no later join drops it: finished, it rides along in a full batch
        engine.submit(prompt, SamplingParams(max_tokens=2, ignore_eos=True)).result()
        waiting = engine.submit(prompt, SamplingParams(max_tokens=1))
        assert len(waiting.result().ids) == 1
        assert not any(f.done() for f in longs), "the new request waited for a long row although a slot was free"
    finally:
        policy.close()


def test_a_failed_merge_into_the_batch_fails_the_rows_joining_it(policy, monkeypatch):
    from harnessrl.policy import engine as engine_module

    merge = engine_module._slab_cache

    def fail_once(*args, **kwargs):  # as running out of memory while merging the joining rows' KV would
        monkeypatch.setattr(engine_module, "_slab_cache", merge)
        raise RuntimeError("out of memory (injected)")

    for prompt in ([5, 6, 7], [5, 6, 7] * 200):  # a short prompt (prefilled whole) and a long one (in chunks)
        monkeypatch.setattr(engine_module, "_slab_cache", fail_once)
        joining = policy.engine.submit(prompt, SamplingParams(max_tokens=3))
        assert str(joining.exception(timeout=60)) == "out of memory (injected)"  # not a request left waiting forever
    assert policy.engine.generate_sync([1, 2, 3], SamplingParams(max_tokens=3)).ids  # the engine still serves


def test_a_step_that_outlasts_close_fails_its_rows_when_it_ends():
    from harnessrl.policy import Policy

    policy = Policy.load("tiny")
    inside, release = threading.Event(), threading.Event()

    def hold(module, args):  # a step longer than close() waits (a big model's prefill on a CPU)
        inside.set()
        release.wait()

    hook = policy.model.get_input_embeddings().register_forward_pre_hook(hold)
    try:
        running = policy.engine.submit([5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True))
        assert inside.wait(timeout=60)
        policy.engine.close(timeout=0)  # returns with the step still running
        release.set()
        assert str(running.exception(timeout=60)) == "engine closed before the completion finished"
    finally:
        release.set()
        hook.remove()


def test_close_fails_what_an_engine_thread_that_died_held():
    """A thread killed by an error (a bug in admission here) failed nothing, and close() left its requests waiting."""
    from harnessrl.policy import Policy

    engine = Policy.load("tiny").engine

    def broken():
        raise RuntimeError("a bug in admission")

    engine._take_pending = broken  # the thread dies at its next admission
    waiting = engine.submit([5, 6, 7], SamplingParams(max_tokens=5))
    engine._thread.join(timeout=60)
    assert not engine._thread.is_alive() and not waiting.done()
    engine.close(timeout=1)
    assert str(waiting.exception(timeout=5)) == "engine closed before the completion finished"


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -1.0),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", "0.7"),
        ("top_p", 0.0),
        ("top_p", 5.0),
        ("top_p", float("nan")),
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("max_tokens", None),
        ("max_tokens", 2.5),
        ("stop", "ld"),  # a bare string: each of its characters would stop
        ("stop", [None]),
        ("stop", [""]),  # found at once in any text
        ("seed", "7"),
        ("ignore_eos", "no"),
    ],
)
def test_sampling_params_refuse_a_bad_value_by_its_name(field, value):
    with pytest.raises(ValueError, match=f"^{field}: "):
        SamplingParams(**{field: value})


def test_sampling_params_take_the_values_a_caller_sends():
    SamplingParams(temperature=0, top_p=1, max_tokens=1, stop=("</s>",), seed=-5, ignore_eos=True)


async def test_a_request_for_no_completions_is_refused(policy):
    for n in (0, -2):
        with pytest.raises(ValueError, match="^n: "):
            await policy.engine.generate([5, 6, 7], SamplingParams(max_tokens=2), n)
