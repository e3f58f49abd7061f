import random

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from harnessrl.policy import Policy
from harnessrl.policy.tiny import build_tiny, build_tokenizer
from tests.conftest import WEATHER_TOOLS, weather_dialogue


def _texts(n: int = 300) -> list[str]:
    rng = random.Random(7)
    alphabet = "abcXYZ 0123456789\n\t  ,.;:'\"{}[]()éü中文😀" + "<|im_end|><tool_call></tool_call>"
    texts = ["".join(rng.choice(alphabet) for _ in range(80)) for _ in range(n)]
    return texts + ["  leading spaces, 2024-05-01, O'Neil's 3.14159 \r\n\r\n trailing  "]


def test_each_tokens_bytes_join_into_the_texts_utf8_where_a_character_spans_tokens(policy):
    for text in _texts(50):
        ids = policy.encode(text)
        assert b"".join(bytes(policy.token_bytes(i)) for i in ids) == text.encode()
    assert any(policy.decode([i]) == "\ufffd" for i in policy.encode("中文😀"))  # a token alone is no character


def test_tiny_is_deterministic_for_a_seed():
    (m1, t1), (m2, t2), (m3, _) = build_tiny(seed=0), build_tiny(seed=0), build_tiny(seed=1)
    assert t1.get_vocab() == t2.get_vocab()
    s1, s2, s3 = m1.state_dict(), m2.state_dict(), m3.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert not torch.equal(s1["model.embed_tokens.weight"], s3["model.embed_tokens.weight"])
    assert 1_000_000 < sum(p.numel() for p in m1.parameters()) < 10_000_000


def test_digits_split_one_per_token():
    tok = build_tokenizer()
    assert tok.convert_ids_to_tokens(tok("2024")["input_ids"]) == ["2", "0", "2", "4"]


def test_ids_survive_save_and_reload_through_both_loaders(tmp_path):
    model, tok = build_tiny()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    # AutoTokenizer resolves a qwen2 folder to Qwen2Tokenizer, which rebuilds its own pre-tokenizer
    loaded = [AutoTokenizer.from_pretrained(tmp_path), PreTrainedTokenizerFast.from_pretrained(tmp_path)]
    chat = tok.apply_chat_template(weather_dialogue(), tools=WEATHER_TOOLS, tokenize=False)
    for text in _texts() + [chat]:
        ids = tok(text)["input_ids"]
        for other in loaded:
            assert other(text)["input_ids"] == ids, (type(other).__name__, text)
    for other in loaded:
        assert other.apply_chat_template(weather_dialogue(), tools=WEATHER_TOOLS, tokenize=False) == chat
        assert other.padding_side == "left"
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tok(chat)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reloaded(ids).logits, atol=1e-5)


def test_chat_template_renders_tools_calls_and_tool_results():
    _, tok = build_tiny()
    text = tok.apply_chat_template(weather_dialogue(), tools=WEATHER_TOOLS, tokenize=False, add_generation_prompt=True)
    system = text.split("<|im_end|>")[0]  # tools in the system turn, one signature line each
    assert "\nget_weather(city: string): " in system and '"type": "function"' not in system
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>' in text
    assert "<|im_start|>tool\nsunny<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    # tool-call markers are single tokens that survive skip_special_tokens
    ids = tok("<tool_call>x</tool_call>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 3 and tok.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_any_local_hugging_face_folder_loads_as_a_policy(tmp_path):
    tiny = Policy.load("tiny")
    tiny.save(tmp_path)
    tiny.close()
    folder = Policy.load(str(tmp_path))
    try:
        assert folder.name == tmp_path.name and folder.version == 0
        assert folder.eos_ids == {folder.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        assert folder.render(weather_dialogue(), WEATHER_TOOLS, True).endswith("<|im_start|>assistant\n")
    finally:
        folder.close()
