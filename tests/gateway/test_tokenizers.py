"""The token path under tokenizers other than tiny's: SentencePiece pieces, a model with more embedding rows than
tokens, a ChatML model whose eos_token is not its end of turn; and stop strings, which the engine matches on text."""

import string

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from harnessrl.gateway import GatewayClient, create_app
from harnessrl.policy import Policy, SamplingParams
from harnessrl.policy.tiny import build_tiny
from harnessrl.train import Trainer
from harnessrl.train.batches import micro_batch
from harnessrl.train.sequences import episode_sequences
from tests.conftest import ADMIN_KEY, WEATHER_TOOLS

CHATML = (
    "{%- for message in messages -%}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style tokenizer built in code (Llama 2's and Mistral's kind): pieces write a space as "▁",
    characters outside them fall back to <0xNN> byte pieces. 362 tokens."""
    words = ["▁Hello", "▁world", "▁the", "▁weather", "▁is", "▁sunny"]
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "▁", *string.printable[:94], *words]
    backend = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=0, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence(  # Llama 2's: "▁" as a space, bytes joined, the text's first space dropped
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", unk_token="<unk>", eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )  # fmt: skip
    tokenizer.chat_template = CHATML
    return tokenizer


@pytest.fixture(scope="module")
def sentencepiece_policy():
    """tiny's 2,050 embedding rows under a tokenizer of 362 tokens: the untrained model puts most of its
    probability on rows no token maps to (as Qwen2.5's 151,936 rows for 151,665 tokens, at a larger share)."""
    model, _ = build_tiny(seed=0)
    policy = Policy(model, sentencepiece_tokenizer(), "sentencepiece")
    yield policy
    policy.close()


def test_sentencepiece_bytes_keep_the_space_a_piece_begins_with(sentencepiece_policy):
    """decode() of one piece drops its word-initial "▁"; the piece's bytes keep it as a space, so the bytes of a
    reply's tokens join to its text (byte-fallback pieces give their byte)."""
    policy = sentencepiece_policy
    ids = policy.encode("Hello wörld")
    pieces = policy.tokenizer.convert_ids_to_tokens(ids)
    assert pieces[:2] == ["▁Hello", "▁"] and "<0xC3>" in pieces and policy.decode(ids[:1]) == "Hello"
    joined = b"".join(bytes(policy.token_bytes(i)) for i in ids)
    assert joined.decode() == " Hello wörld"  # the text those tokens write after earlier text (a prompt)
    assert policy.decode(ids) == "Hello wörld"  # decoding the whole drops the first space only, at the text's start


async def test_ids_past_the_tokenizer_are_never_sampled_and_the_trainer_scores_what_was_sampled(sentencepiece_policy):
    """An id past the tokenizer has no text (its bytes raised: a 500 for a call already recorded). The sampler leaves
    those rows out, and the trainer's sampling distribution does too, so the ratio of a sampled token is 1."""
    policy = sentencepiece_policy
    assert policy.model.get_input_embeddings().num_embeddings > len(policy.tokenizer)
    gateway = GatewayClient(ADMIN_KEY, app=create_app(policy, ADMIN_KEY))
    episode_id, key = await gateway.create_episode()
    r = await gateway.openai(key).chat.completions.create(
        model="sentencepiece", messages=[{"role": "user", "content": "Hello"}], max_tokens=24, logprobs=True,
        seed=0, top_p=0.95, extra_body={"ignore_eos": True},
    )  # fmt: skip
    episode = await gateway.episode(episode_id)
    await gateway.aclose()
    (call,) = episode.calls
    assert len(call.completion_ids) == 24 and max(call.completion_ids) < len(policy.tokenizer)
    assert [t.id for t in r.choices[0].logprobs.content] == call.completion_ids
    trainer = Trainer(policy.model, policy.tokenizer)
    mb = micro_batch(episode_sequences(episode))
    scored = trainer._logprobs(trainer.model, mb)[mb.mask > 0]  # the proximal and reference policies' scoring
    assert torch.allclose(scored, torch.tensor(call.sampled_logprobs), atol=1e-4)


def test_tiny_has_a_token_for_every_row_so_nothing_is_left_out(policy):
    assert policy.engine.vocab == len(policy.tokenizer) == policy.model.get_input_embeddings().num_embeddings == 2050


async def test_a_demonstration_ends_at_the_end_of_turn_token_when_eos_token_is_another():
    """Qwen2.5's base models are ChatML with eos_token <|endoftext|>: their turns end with <|im_end|>."""
    model, tokenizer = build_tiny(seed=0)
    tokenizer.eos_token = "<|endoftext|>"
    policy = Policy(model, tokenizer, "chatml-base")
    gateway = GatewayClient(ADMIN_KEY, app=create_app(policy, ADMIN_KEY))
    episode_id, key = await gateway.create_episode()
    reply = {"role": "assistant", "content": "It is sunny."}
    body = {"messages": [{"role": "user", "content": "Weather?"}], "reply": reply}
    await gateway.openai(key).post("/demonstrations", cast_to=object, body=body)
    (call,) = (await gateway.episode(episode_id)).calls
    await gateway.aclose()
    policy.close()
    assert policy.decode(call.completion_ids) == "It is sunny.<|im_end|>"


async def test_of_several_stop_strings_the_one_that_starts_first_cuts_the_reply(policy):
    """OpenAI and vLLM cut a reply at the earliest stop string, whichever place it has in the list."""
    prompt = policy.encode(policy.render([{"role": "user", "content": "word word"}], None, True))
    free = (await policy.engine.generate(prompt, SamplingParams(seed=0, max_tokens=30, ignore_eos=True)))[0]
    text = policy.decode(free.ids)
    # a 3-character stop and its last 2 characters, neither seen before: one token completes both; the later listed first
    at = next(
        k
        for k in range(4, len(text) - 3)
        if text.find(text[k : k + 3]) == k and text.find(text[k + 1 : k + 3]) == k + 1
    )
    early, late = text[at : at + 3], text[at + 1 : at + 3]
    params = SamplingParams(seed=0, max_tokens=30, stop=[late, early], ignore_eos=True)
    assert (await policy.engine.generate(prompt, params))[0].stop_text == early
    gateway = GatewayClient(ADMIN_KEY, app=create_app(policy, ADMIN_KEY))
    r = await gateway.openai(ADMIN_KEY).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "word word"}], seed=0, max_tokens=30,
        stop=[late, early], extra_body={"ignore_eos": True},
    )  # fmt: skip
    await gateway.aclose()
    assert r.choices[0].message.content == text[:at]


async def test_a_call_whose_close_tag_a_stop_string_cut_comes_back_as_a_call(gateway):
    """stop=["</tool_call>"] is a common way to end a turn at its call: the call's JSON is whole without the tag."""
    _, key = await gateway.create_episode()
    r = await gateway.openai(key).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=WEATHER_TOOLS,
        temperature=0, max_tokens=40, stop=["</tool_call>"],
    )  # fmt: skip
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
