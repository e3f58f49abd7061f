"""Policy: a causal LM, its tokenizer and chat template, and the engine that samples from it.

`Policy.load("tiny")` builds the offline tiny model; `Policy.load(PATH)` loads any local Hugging Face
causal-LM folder that has a chat template, a `.gguf` file, or a preset (`smollm2-135m-instruct`, see
`sources`). Nothing is fetched from a hub. Tools are shown and read back in the model's tool format
(`toolformat`): the template's own rendering when it has one.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from harnessrl.policy import toolformat
from harnessrl.policy.engine import Engine
from harnessrl.policy.sources import PRESETS, SHIPPED, PolicyLoadError, SourceError, adapter_note, local_folder
from harnessrl.policy.tiny import build_tiny


class Policy:
    def __init__(
        self,
        model,
        tokenizer,
        name: str,
        max_batch: int = 64,
        tool_format: str = "auto",
        vllm_url: str | None = None,
        sync_dir: str | Path | None = None,
    ):
        if not tokenizer.chat_template:
            raise PolicyLoadError(f"{name}: the tokenizer has no chat_template; the gateway needs one")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        if tool_format == "auto":
            tool_format = toolformat.guess_format(tokenizer.chat_template)
        try:
            self.tool_format = toolformat.tool_format(tool_format)
        except ValueError as exc:
            raise PolicyLoadError(f"--tool-format: {exc}") from None
        self.native_tools, self.native_calls = toolformat.renders_tools(self._template)
        # Qwen2.5's and Llama 3.1's templates write `arguments | tojson`: JSON text would come out quoted
        self.arguments_as_objects = self.native_calls and toolformat.encodes_arguments(self._template)
        self.context = model.config.max_position_embeddings
        self.eos_ids = _eos_ids(model, tokenizer)
        if vllm_url is None:
            self.engine = Engine(model, self.eos_ids, self.decode, max_batch=max_batch, vocab=len(tokenizer))
        else:  # generation on an external vLLM server, synced from the trainer (policy/vllm.py)
            from harnessrl.policy.vllm import VLLMEngine

            folder = Path(sync_dir) if sync_dir else Path.home() / ".cache" / "harnessrl" / "vllm-sync"
            self.engine = VLLMEngine(vllm_url, model, self.eos_ids, folder)
            self.context = self.engine.context  # the server's --max-model-len where it is smaller

    @classmethod
    def load(
        cls,
        model: str = "tiny",
        seed: int = 0,
        max_batch: int = 64,
        tool_format: str = "auto",
        vllm_url: str | None = None,
        sync_dir: str | Path | None = None,
    ) -> Policy:
        """`tiny` (built in code for `seed`), a shipped base, a preset, or a local Hugging Face folder or
        `.gguf` file; `tool_format` is `auto` (from the chat template) or one of `toolformat.FORMATS`;
        `vllm_url`: generate on that vLLM server (started on the same weights) instead of in process."""
        lm, tokenizer = load_model_and_tokenizer(model, seed)
        name = model if model in ("tiny", *SHIPPED, *PRESETS) else Path(model).name
        return cls(lm, tokenizer, name, max_batch, tool_format, vllm_url, sync_dir)

    @property
    def version(self) -> int:
        return self.engine.version

    def update_weights(self, state_dict: dict[str, torch.Tensor], at_least: int = 0) -> int:
        """Load new weights into the serving model; returns the new policy_version (one up, or `at_least`)."""
        return self.engine.update_weights(state_dict, at_least)

    def save(self, path: str | Path) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool) -> str:
        """The chat template's text; tools, calls and results written in the tool format where the
        template does not render them itself."""
        if not (self.native_tools and self.native_calls):
            shown = None if self.native_tools else tools
            messages = toolformat.adapt(messages, shown, self.tool_format, calls_too=not self.native_calls)
        if self.arguments_as_objects:
            messages = toolformat.arguments_as_objects(messages)
        return self._template(messages, tools if self.native_tools else None, generation_prompt)

    def call_prefix(self, name: str | None = None) -> str:
        """The start of a reply that calls `name` (any tool when None), as this model writes calls:
        what the gateway forces for `tool_choice`."""
        if name is None or not self.native_calls:
            return self.tool_format.prefix(name)
        call = {"id": "c0", "type": "function", "function": {"name": name, "arguments": '{"_": 0}'}}
        turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
        return self.tool_format.prefix(name, self.render(turn, None, False))

    def _template(self, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool = False):
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def token_bytes(self, token_id: int) -> list[int]:
        """The raw bytes one token stands for (OpenAI's `logprobs.content[].bytes`, which clients join to rebuild
        characters split across tokens): a byte-level BPE piece through its byte alphabet, a byte-fallback piece
        `<0xNN>` as its byte, a SentencePiece piece with its "▁" as a space, any other token its text's UTF-8
        (decoding one token alone gives U+FFFD for part of a character, and drops a word-initial "▁")."""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:  # an embedding row past the tokenizer (never sampled here; another server's reply): no text
            return []
        if self._byte_of is not None and all(c in self._byte_of for c in piece):
            return [self._byte_of[c] for c in piece]
        if byte := re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece):
            return [int(byte[1], 16)]
        if self._metaspace:
            return list(piece.replace("▁", " ").encode())
        return list(self.decode([token_id]).encode())

    @functools.cached_property
    def _decoder(self) -> str:
        """The fast tokenizer's decoder, as text ("" for a slow tokenizer): what its pieces spell."""
        return repr(getattr(getattr(self.tokenizer, "backend_tokenizer", None), "decoder", None) or "")

    @functools.cached_property
    def _byte_of(self) -> dict[str, int] | None:
        """A byte-level BPE tokenizer's alphabet (character -> byte); None for other tokenizers."""
        return {c: b for b, c in bytes_to_unicode().items()} if "ByteLevel" in self._decoder else None

    @functools.cached_property
    def _metaspace(self) -> bool:
        """Whether the tokenizer writes a space as "▁" in its pieces (SentencePiece: Llama 2, Gemma, Mistral):
        its decoder is a Metaspace or replaces "▁" with a space."""
        return "▁" in self._decoder

    def close(self) -> None:
        self.engine.close()


TINY_BASE = SHIPPED["tiny-base"]


def load_model_and_tokenizer(model: str = "tiny", seed: int = 0):
    """`tiny` (built in code for `seed`), a shipped base (`tiny-base`, `tiny-base-long`), a preset, or a
    local Hugging Face folder or `.gguf` file; fp32, eval mode."""
    if model == "tiny":
        return build_tiny(seed=seed)
    try:
        path = SHIPPED[model] if model in SHIPPED else local_folder(model)
    except SourceError as exc:
        raise PolicyLoadError(str(exc)) from None
    if not (path / "config.json").is_file():
        names = ", ".join(["tiny", *SHIPPED, *PRESETS])
        raise PolicyLoadError(
            f"--model {model}: not one of {names}, a .gguf file or a folder with a config.json{adapter_note(path)}"
        )
    _check_files(model, path)
    tokenizer = None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        lm, loading = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    except Exception as exc:  # transformers' errors have many types: no tokenizer files, bad weights, ...
        # without tokenizer.json transformers tries a slow tokenizer and asks for sentencepiece: name the file instead
        lacks = " (it has no tokenizer.json)" if tokenizer is None and not (path / "tokenizer.json").is_file() else ""
        raise PolicyLoadError(f"--model {model}: {path} does not load{lacks} ({type(exc).__name__}: {exc})") from exc
    # transformers fills weights the files lack with random ones, and only logs it: a model that would run on noise
    if missing := sorted(loading["missing_keys"]):
        raise PolicyLoadError(
            f"--model {model}: {path}'s weight files lack {len(missing)} of {type(lm).__name__}'s tensors "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): a partial save, or another architecture's"
        )
    if not hasattr(lm.config, "max_position_embeddings"):  # ALiBi models (Bloom, MPT) name no context length
        raise PolicyLoadError(
            f"--model {model}: {path / 'config.json'} has no max_position_embeddings, the context prompts are held "
            "to: add it (the length the model was trained on, e.g. 2048)"
        )
    lm.eval()
    # tokenizer files missing (transformers then builds an empty one) or another model's: ids the model cannot embed
    if not tokenizer("hello world")["input_ids"]:
        raise PolicyLoadError(f"--model {model}: {path}'s tokenizer encodes nothing (its tokenizer files missing?)")
    # the base vocabulary: added tokens may lie past the rows (Gemma 3's image token, a [PAD] added without resizing)
    if tokenizer.vocab_size > (rows := lm.get_input_embeddings().num_embeddings):
        raise PolicyLoadError(
            f"--model {model}: {path}'s tokenizer has {tokenizer.vocab_size} tokens, its model embeds {rows}: "
            "another model's"
        )
    return lm, tokenizer


def _check_files(model: str, path: Path) -> None:
    """Every JSON and safetensors file at the top of `path` parses (safetensors: its header, which says how long the
    file must be): a truncated or garbled one is named here; transformers reports a JSONDecodeError at line 3847 or
    a safetensors header "not fully covered" without naming the file, and loads a broken generation_config.json as
    if it were absent (losing its end-of-turn ids)."""
    from safetensors import safe_open

    for file in sorted(path.glob("*.json")):
        try:
            json.loads(file.read_bytes())
        except ValueError as exc:  # a JSONDecodeError or a UnicodeDecodeError
            raise PolicyLoadError(f"--model {model}: {file} is not valid JSON (truncated?): {exc}") from None
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(file, "pt"):
                pass
        except Exception as exc:  # safetensors' errors: SafetensorError (truncated, not safetensors), OSError
            raise PolicyLoadError(f"--model {model}: {file} does not read (truncated?): {exc}") from None


def _eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    eos = model.generation_config.eos_token_id if model.generation_config else None
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(end_of_turn, int) and end_of_turn != tokenizer.unk_token_id:
        ids.add(end_of_turn)
    return ids
