from harnessrl.train.sequences import episode_sequences
from harnessrl.types import Call, Episode
from tests.conftest import WEATHER_TOOLS


def _call(prompt, completion, trainable=True, agent="main", version=0, lineage=None):
    return Call(
        agent=agent, lineage=lineage, prompt_ids=prompt, completion_ids=completion, sampled_logprobs=[-0.5] * len(completion),
        policy_version=version, trainable=trainable,
    )  # fmt: skip


def test_tool_turns_merge_a_prune_splits_and_frozen_calls_never_carry_loss():
    episode = Episode(calls=[
        _call([1, 2, 3], [10, 11]),                          # assistant calls a tool
        _call([1, 2, 3, 10, 11, 20, 21], [12], version=1),   # tool result 20 21, then the answer
        _call([5, 6], [30, 31], trainable=False, agent="sub"),  # a frozen sub-agent's own conversation
        _call([1, 2, 3, 20, 21], [13, 14]),                  # after a prune: does not extend anything
        _call([1, 2, 3, 10, 11, 20, 21, 12, 22], [40], trainable=False),  # frozen turn inside the first
    ])  # fmt: skip
    first, pruned = episode_sequences(episode, advantage=0.5)
    assert first.ids == [1, 2, 3, 10, 11, 20, 21, 12, 22, 40]
    assert first.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 0]
    assert first.sampled_logprobs == [0, 0, 0, -0.5, -0.5, 0, 0, -0.5, 0, -0.5]
    assert first.versions == [-1, -1, -1, 0, 0, -1, -1, 1, -1, 0]
    assert first.calls == [0, 1, 4] and first.advantage == 0.5
    assert pruned.ids == [1, 2, 3, 20, 21, 13, 14] and pruned.loss_mask == [0, 0, 0, 0, 0, 1, 1]
    # the frozen sub-agent's sequence has no loss token, so it is not a training sequence at all


async def test_a_recorded_tool_conversation_masks_exactly_the_sampled_tokens(gateway, tool_policy):
    from tests.gateway.test_gateway import _five_turns

    episode_id, key = await gateway.create_episode()
    await _five_turns(gateway.openai(key))
    episode = await gateway.episode(episode_id)
    (seq,) = episode_sequences(episode, 1.0)
    sampled = [t for c in episode.calls for t in c.completion_ids]
    assert [t for t, m in zip(seq.ids, seq.loss_mask) if m] == sampled
    assert seq.ids[: len(episode.calls[-1].prompt_ids)] == episode.calls[-1].prompt_ids
    masked_text = tool_policy.decode([t for t, m in zip(seq.ids, seq.loss_mask) if not m])
    assert (
        "sunny in" in masked_text and WEATHER_TOOLS[0]["function"]["name"] in masked_text
    )  # tool output, tools: no loss


def test_a_summary_chain_shares_one_weight_and_the_summary_carries_loss_unless_masked():
    episode = Episode(calls=[
        _call([1, 2], [10]),                                # a turn
        _call([1, 2, 10, 20], [11, 12], agent="summariser", lineage="main"),  # the summary: extends the turn
        _call([1, 2, 30, 11, 12], [13]),                    # restarted from issue + summary: a new segment
    ])  # fmt: skip
    before, after = episode_sequences(episode, advantage=1.0)
    assert before.loss_mask == [0, 0, 1, 0, 1, 1] and (before.weight, after.weight) == (1.0, 1.0)
    shared = episode_sequences(episode, advantage=1.0, share=True)
    assert [s.weight for s in shared] == [0.5, 0.5] and sum(s.weight for s in shared) == 1.0
    masked, _ = episode_sequences(episode, advantage=1.0, mask_agents=["summariser"], share=True)
    assert masked.loss_mask == [0, 0, 1, 0, 0, 0]
    # a chain of one segment weighs 1 either way
    (alone,) = episode_sequences(Episode(calls=[_call([1], [2])]), 1.0, share=True)
    assert alone.weight == 1.0
