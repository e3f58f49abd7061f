"""Checkpoints: a Hugging Face folder that transformers and vLLM load as is, plus the trainer state.

Layout under a run's `checkpoints/`:

    step-000012/   config.json, model.safetensors, tokenizer files, trainer_state.pt [, adapter/]
    latest         the name of the newest complete checkpoint

The number is the caller's counter (the optimizer step, or the RL job's update cursor). A checkpoint
is written to a hidden temporary folder and renamed into place, and `latest` is replaced atomically
after it. A folder of the same number is moved aside, not deleted, until the new one is in place; and
when `latest` names a folder that is missing or incomplete (a crash in between), `latest_checkpoint`
falls back to the newest complete one (one moved aside included). So a crash at any moment leaves a
checkpoint to resume from.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.pt"


def save_checkpoint(root: Path, number: int, write_model, state: dict[str, Any], keep: int = 3) -> Path:
    """`write_model(folder)` writes the Hugging Face files; `state` is pickled beside them."""
    import torch  # here, not at the top: the registry's writers (promote, rollback) need no torch

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{number:06d}"
    tmp, aside = root / f".{final.name}.tmp", root / f".{final.name}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_model(tmp)
    torch.save(state, tmp / STATE_FILE)
    fsync_tree(tmp)
    if final.exists():  # the same number again (a resumed run): keep the old one until the new one is in place
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(tmp, final)
    write_atomic(root / "latest", final.name)
    shutil.rmtree(aside, ignore_errors=True)
    for old in _complete(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint `latest` names, or the newest complete one when that is missing or incomplete."""
    pointer = root / "latest"
    if pointer.is_file() and (path := root / pointer.read_text().strip()).joinpath(STATE_FILE).is_file():
        return path
    complete = _complete(root)
    return complete[-1] if complete else None


def _complete(root: Path) -> list[Path]:
    """Checkpoint folders with their trainer state, oldest first (by number: step-1000000 follows step-999999). A
    folder moved aside stands in for its number while the number's own folder is missing (a crash before its
    successor was renamed into place); read only here, so a reader beside the writer changes nothing."""
    found = {}
    for path in [*root.glob(".step-*.old"), *root.glob("step-*")]:  # a number's own folder last: it wins
        number = path.name.removeprefix(".").removesuffix(".old").removeprefix("step-")
        if number.isdigit() and (path / STATE_FILE).is_file():
            found[int(number)] = path
    return [found[n] for n in sorted(found)]


def load_state(path: Path, map_location: str | None = None) -> dict[str, Any]:
    import torch

    return torch.load(path / STATE_FILE, weights_only=False, map_location=map_location)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_tree(folder: Path) -> None:
    """Every file and folder under `folder`, and `folder` itself, on disk before it is renamed into place: a folder's
    entries are its own data, so a synced file in an unsynced folder can still be lost in a power cut."""
    for path in [*folder.rglob("*"), folder]:
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        elif path.is_dir():
            fsync_dir(path)


def fsync_dir(folder: Path) -> None:
    """A folder's entries (a rename into it, a new file) on disk; skipped where the OS opens or syncs no folders."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows opens no folders
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse to sync a folder (EINVAL)
        pass
    finally:
        os.close(fd)
