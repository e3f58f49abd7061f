"""Checkpoints: a Hugging Face folder that transformers and vLLM load as is, plus the trainer state.

Layout under a run's `checkpoints/`:

    step-000012/   config.json, model.safetensors, tokenizer files, trainer_state.pt [, adapter/]
    latest         the name of the newest complete checkpoint

A checkpoint is written to a hidden temporary folder and renamed into place, and `latest` is
replaced atomically after it, so a crash at any moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"


def save_checkpoint(root: Path, step: int, write_model, state: dict[str, Any], keep: int = 3) -> Path:
    """`write_model(folder)` writes the Hugging Face files; `state` is pickled beside them."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_model(tmp)
    torch.save(state, tmp / STATE_FILE)
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_atomic(root / "latest", final.name)
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / STATE_FILE).is_file() else None


def load_state(path: Path) -> dict[str, Any]:
    return torch.load(path / STATE_FILE, weights_only=False)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(folder: Path) -> None:
    for file in folder.rglob("*"):
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
