"""Policy: a causal LM, its tokenizer and chat template, and the engine that samples from it.

`Policy.load("tiny")` builds the offline tiny model; `Policy.load(PATH)` loads any local Hugging Face
causal-LM folder that has a chat template. Nothing is fetched from a hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from harnessrl.policy.engine import Engine
from harnessrl.policy.tiny import build_tiny


class PolicyLoadError(ValueError):
    pass


class Policy:
    def __init__(self, model, tokenizer, name: str, max_batch: int = 64):
        if not tokenizer.chat_template:
            raise PolicyLoadError(f"{name}: the tokenizer has no chat_template; the gateway needs one")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.context = model.config.max_position_embeddings
        self.eos_ids = _eos_ids(model, tokenizer)
        self.engine = Engine(model, self.eos_ids, self.decode, max_batch=max_batch)

    @classmethod
    def load(cls, model: str = "tiny", seed: int = 0, max_batch: int = 64) -> Policy:
        """`tiny` (built in code for `seed`), `tiny-base`, or the path of a local Hugging Face folder."""
        lm, tokenizer = load_model_and_tokenizer(model, seed)
        return cls(lm, tokenizer, model if model in ("tiny", "tiny-base") else Path(model).name, max_batch)

    @property
    def version(self) -> int:
        return self.engine.version

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Load new weights into the serving model; returns the new policy_version."""
        return self.engine.update_weights(state_dict)

    def save(self, path: str | Path) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def close(self) -> None:
        self.engine.close()


TINY_BASE = Path(__file__).parent / "tiny_base"


def load_model_and_tokenizer(model: str = "tiny", seed: int = 0):
    """`tiny` (built in code for `seed`), `tiny-base` (shipped, pretrained) or a local Hugging Face
    folder; fp32, eval mode."""
    if model == "tiny":
        return build_tiny(seed=seed)
    path = TINY_BASE if model == "tiny-base" else Path(model)
    if not (path / "config.json").is_file():
        raise PolicyLoadError(f"--model {model}: not 'tiny', 'tiny-base' or a folder with a config.json")
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return lm, tokenizer


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
