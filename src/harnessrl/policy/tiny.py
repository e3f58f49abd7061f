"""`tiny`: a Qwen2-architecture causal LM and its tokenizer, built in code, offline, deterministic.

The tokenizer is a byte-level BPE trained in-process on a built-in text (English prose, JSON,
tool-call syntax). It pre-tokenizes exactly as transformers' Qwen2Tokenizer does (NFC, Qwen's split
regex, digits one per token), because `AutoTokenizer` on a folder whose config says qwen2 rebuilds
that pipeline: ids then survive a save and a reload through either loader. Its chat template is ChatML with tools: OpenAI `tools` go into the system
turn, one signature line each (`name(arg: type, ...): description`; argument descriptions and
`required` are left out, which keeps a five-tool system turn under 200 tokens for a model
pretrained on 512-token rows), the model answers with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the
Hermes / Qwen2.5 convention), and `tool` messages are rendered back as their own turn.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# added but not special: they must survive decode(skip_special_tokens=True) so tool calls parse
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]

CHAT_TEMPLATE = """\
{%- set system = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- if tools or system is not none -%}
<|im_start|>system
{% if system is not none %}{{ system }}{% endif %}
{%- if tools %}{% if system is not none %}{{ "\n\n" }}{% endif %}# Tools
You may call functions. Signatures:
<tools>
{% for tool in tools %}{% set fn = tool.function if tool.function is defined else tool -%}
{% set params = fn.parameters.properties if fn.parameters is defined and fn.parameters.properties is defined else {} -%}
{{ fn.name }}({% for name, p in params.items() %}{{ name }}: {{ p.type if p.type is defined else "any" }}{{ ", " if not loop.last }}{% endfor %}){{ ": " + fn.description if fn.description }}
{% endfor %}</tools>
To call one, answer with <tool_call>{"name": <name>, "arguments": <json object>}</tool_call>
{%- endif %}<|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if not (loop.first and message.role == 'system') -%}
<|im_start|>{{ message.role }}
{% if message.content %}{{ message.content }}{% endif %}
{%- if message.role == 'assistant' and message.tool_calls -%}
{%- for call in message.tool_calls -%}
{%- set fn = call.function if call.function is defined else call -%}
<tool_call>{"name": "{{ fn.name }}", "arguments": {{ fn.arguments if fn.arguments is string else fn.arguments | tojson }}}</tool_call>
{%- endfor -%}
{%- endif %}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""

# transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX (kept here: it must never drift)
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# JSON punctuation and the chat format, added to the English prose in tokenizer_text.txt
_FORMAT_TEXT = """\
The quick brown fox jumps over the lazy dog. A search agent reads documents, keeps what matters
and prunes the rest. Which city is the capital of the country where the river begins? The answer
is in the document about the river. Please find the population of the town and report the year.
You are a helpful assistant. Use the tools when they help. Search the corpus, read a document,
then answer with the text and the ids of the documents you used. The weather in the city is sunny
and warm today; tomorrow it will rain. Alice wrote a letter to Bob about the meeting on Monday.
Results: title, text, id, name, value, score, query, pattern, chunk, answer, question, arguments.
{"name": "search_corpus", "arguments": {"query": "river source"}} {"type": "function"}
{"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
[{"id": "doc_12", "title": "History", "text": "It was founded in 1204."}] true false null
def main(): return 0 # code: print("hello world") if x == 1 else None; import os, json
user assistant system tool function description parameters properties required string number
"""


@cache
def tokenizer_text() -> str:
    """The packaged English prose (with its two-line header)."""
    return files("harnessrl.policy").joinpath("tokenizer_text.txt").read_text(encoding="utf-8")


@cache
def prose_lines() -> tuple[str, ...]:
    return tuple(line for line in tokenizer_text().splitlines() if not line.startswith("#"))


def build_tokenizer(vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the built-in text; the same inputs always give the same vocab."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = list(prose_lines()) + _FORMAT_TEXT.splitlines() * 8
    tok.train_from_iterator(lines, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )
    wrapped.add_tokens(TOOL_TOKENS)
    return wrapped


def build_tiny(seed: int = 0, hidden: int = 256, layers: int = 4, context: int = 4096):
    """The `tiny` model and tokenizer: same seed, same weights and vocab, bit for bit."""
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.eval()
    return model, tokenizer
