"""Package exports that load on first use (STYLE.md: import heavy libraries lazily), so that a
command such as `harnessrl rollback` never imports torch or transformers."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def exports(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` (PEP 562) that imports `name` from `where[name]` when first asked for."""

    def __getattr__(name: str) -> object:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
