"""The model registry: immutable versions `name@vN`, one promoted at a time, every decision logged.

Layout of a registry folder:

    registry.json        {"name": NAME}
    versions/NAME@vN/    a Hugging Face folder (config.json, model.safetensors, tokenizer files)
                         + version.json: parent, data window, figures, the gate's decision
    PROMOTED             the id of the version `harnessrl serve --registry` serves (one line)
    events.jsonl         one line per cycle, promotion and rollback, with its figures

A version is written to a hidden staging folder and renamed into `versions/` only once complete, and
PROMOTED is replaced atomically (write, fsync, rename), so a crash at any moment leaves PROMOTED
naming a complete version. Versions are never modified after the rename. Writers (cycle, promote,
rollback, add) hold `.lock` (flock) while they write, so two never interleave; a cycle holds it only
for its writes, so `promote` and `rollback` never wait for a cycle's training.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harnessrl.train.checkpoint import fsync_dir, fsync_tree, write_atomic
from harnessrl.types import first_error

if TYPE_CHECKING:
    from harnessrl.policy import Policy

_ID = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)@v(?P<number>[0-9]+)$")


class RegistryError(ValueError):
    """A registry that cannot do what was asked; the message names the folder or version."""


def _read_version(path: Path) -> VersionInfo:
    """A version.json; one cut short or edited by hand is a RegistryError naming it."""
    try:
        return VersionInfo.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as exc:
        raise RegistryError(f"{path}: {first_error(exc, 'version.json')}") from None


class VersionInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(description="NAME@vN")
    number: int = Field(description="N: also the policy_version its calls record")
    parent: str | None = Field(default=None, description="the version it was trained from")
    created_at: float = Field(default_factory=time.time)
    source: str | None = Field(default=None, description="for a version added by hand: the model it was made from")
    data_window: dict[str, float] | None = Field(
        default=None, description="{since, until}: the traffic it learned from"
    )
    figures: dict[str, Any] = Field(default_factory=dict, description="data counts, reward, eval and canary figures")
    decision: dict[str, Any] = Field(default_factory=dict, description="{promote: bool, reasons: [...]}")


class Registry:
    def __init__(self, root: Path):
        self.root = Path(root)
        meta = self.root / "registry.json"
        if not meta.is_file():
            raise RegistryError(f"{self.root}: not a registry (no registry.json); create one with `harnessrl registry`")
        try:
            self.name = json.loads(meta.read_text())["name"]
        except (ValueError, KeyError, TypeError) as exc:  # not UTF-8 or JSON, or no "name": damaged
            raise RegistryError(f'{meta}: expected {{"name": NAME}} ({type(exc).__name__}: {exc})') from None

    @classmethod
    def create(cls, root: Path, name: str) -> Registry:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", name):
            raise RegistryError(f"the registry's name {name!r} (--create): letters, digits, '.', '_' and '-' only")
        root = Path(root)
        if (root / "registry.json").is_file():
            existing = cls(root)
            if existing.name != name:
                raise RegistryError(f"{root}: already a registry of {existing.name!r}, not {name!r}")
            return existing
        (root / "versions").mkdir(parents=True, exist_ok=True)
        write_atomic(root / "registry.json", json.dumps({"name": name}) + "\n")
        return cls(root)

    # ---- reading ----

    def versions(self) -> list[VersionInfo]:
        found = [
            _read_version(p / "version.json")
            for p in (self.root / "versions").iterdir()
            if (p / "version.json").is_file()
        ]
        return sorted(found, key=lambda v: v.number)

    def info(self, version: str) -> VersionInfo:
        path = self.path(version) / "version.json"
        if not path.is_file():
            known = ", ".join(v.id for v in self.versions()) or "none"
            raise RegistryError(f"no version {self.resolve(version)!r} in {self.root} (versions: {known})")
        return _read_version(path)

    def path(self, version: str) -> Path:
        return self.root / "versions" / self.resolve(version)

    def resolve(self, version: str) -> str:
        """`NAME@vN`, `vN` or `N` to the full id."""
        text = version if "@" in version else f"{self.name}@v{version.removeprefix('v')}"
        match = _ID.match(text)
        if match is None or match["name"] != self.name:
            raise RegistryError(f"version {version!r}: expected {self.name}@vN, vN or N")
        return text

    def promoted(self) -> str | None:
        pointer = self.root / "PROMOTED"
        return pointer.read_text().strip() if pointer.is_file() else None

    def events(self) -> list[dict[str, Any]]:
        path = self.root / "events.jsonl"
        if not path.is_file():
            return []
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line from a crash mid-append
                continue
        return events

    def load(self, version: str, max_batch: int = 64, tool_format: str = "auto", prefix_cache: int = 0) -> Policy:
        """A policy serving `version` under the registry's name; its calls record policy_version N
        (`prefix_cache`: the engine's, in tokens)."""
        from harnessrl.policy import Policy
        from harnessrl.policy.model import load_model_and_tokenizer

        info = self.info(version)
        model, tokenizer = load_model_and_tokenizer(str(self.path(info.id)))
        policy = Policy(model, tokenizer, self.name, max_batch, tool_format)
        policy.engine.version = info.number
        policy.engine.prefix_cache = prefix_cache
        return policy

    # ---- writing (hold the lock) ----

    @contextlib.contextmanager
    def lock(self, name: str = ".lock") -> Iterator[None]:
        """`.lock`: held briefly by every writer; `.cycle-lock`: held by a cycle throughout (one at a time)."""
        with open(self.root / name, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def next_number(self) -> int:
        return max((v.number for v in self.versions()), default=0) + 1

    def add(self, write_model, info: VersionInfo) -> VersionInfo:
        """Write a new version: `write_model(folder)` writes the Hugging Face files into staging, then
        version.json goes beside them and the folder is renamed into place."""
        staging = self.root / f".staging-{info.id}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        write_model(staging)
        (staging / "version.json").write_text(info.model_dump_json(indent=1) + "\n")
        fsync_tree(staging)
        final = self.root / "versions" / info.id
        if final.exists():
            raise RegistryError(f"{final}: versions are immutable and this one exists")
        os.replace(staging, final)
        fsync_dir(self.root / "versions")
        return info

    def add_model(self, model: str, seed: int = 0) -> VersionInfo:
        """A version made from a model (`tiny-base`, a preset, a folder): the start of a registry."""
        from harnessrl.policy.model import load_model_and_tokenizer

        lm, tokenizer = load_model_and_tokenizer(model, seed)

        def write(folder: Path) -> None:
            lm.save_pretrained(folder)
            tokenizer.save_pretrained(folder)

        number = self.next_number()
        info = VersionInfo(id=f"{self.name}@v{number}", number=number, source=model, decision={"added": True})
        return self.add(write, info)

    def promote(self, version: str, reason: str, **figures: Any) -> str:
        """Point PROMOTED at `version` (atomic) and log it; returns the version it replaced (or None)."""
        target = self.info(version).id
        before = self.promoted()
        write_atomic(self.root / "PROMOTED", target + "\n")
        fsync_dir(self.root)
        self.log("promote", version=target, previous=before, reason=reason, **figures)
        return before

    def rollback(self) -> tuple[str, str]:
        """Back to the version promoted before the current one; returns (from, to)."""
        current = self.promoted()
        stack = _walked_back(self.promotions(), current)
        if current is None or not stack:
            raise RegistryError(f"{self.root}: nothing to roll back to (promoted: {current})")
        target = stack[-1]
        write_atomic(self.root / "PROMOTED", target + "\n")
        fsync_dir(self.root)
        self.log("rollback", version=target, previous=current)
        return current, target

    def promotions(self) -> list[str]:
        """The promotion stack events.jsonl replays: a promotion pushes its version, a rollback pops the
        one it left, as often as it was pushed in a row (so a version promoted again after a rollback is a rollback's target again)."""
        stack: list[str] = []
        for e in self.events():
            if e["event"] == "promote":
                stack.append(e["version"])
            elif e["event"] == "rollback":
                stack = _walked_back(stack, e["previous"])  # as rollback() walked back
                if not stack or stack[-1] != e["version"]:
                    stack.append(e["version"])
        return stack

    def log(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "at": time.time(), **fields}, default=str)
        with open(self.root / "events.jsonl", "a+b") as f:
            torn = f.tell() > 0 and os.pread(f.fileno(), 1, f.tell() - 1) != b"\n"  # a crash cut the last line
            f.write((b"\n" if torn else b"") + line.encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())

    def clean_staging(self) -> list[str]:
        """Staging folders a crashed cycle left behind: removed; returns their names."""
        left = [p for p in self.root.glob(".staging-*") if p.is_dir()]
        for path in left:
            shutil.rmtree(path, ignore_errors=True)
        return [p.name for p in left]


def _walked_back(stack: list[str], current: str | None) -> list[str]:
    """The promotion stack below `current`: cut back to its last push first, for a `current` that is not on top (a
    rollback killed after switching PROMOTED, before its line, then run again, walks on from there), then its
    pushes in a row popped."""
    if current in stack:
        stack = stack[: len(stack) - stack[::-1].index(current)]
    while stack and stack[-1] == current:
        stack = stack[:-1]
    return stack
