"""Tools are typed Python functions: the signature and docstring become the OpenAI tool schema, and
a model's call is validated against the same signature before the function runs.

A bad call (unknown tool, arguments that do not validate, JSON that does not parse) or a tool that
raises or times out becomes an error observation for the model — never a crashed episode.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import regex
from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")


def tool_schema(fn: Callable) -> dict[str, Any]:
    """The OpenAI `tools` entry of a function: name, first docstring paragraph, typed parameters."""
    doc = inspect.getdoc(fn) or ""
    parameters = TypeAdapter(fn).json_schema()
    described = _arg_docs(doc)
    for name, prop in parameters.get("properties", {}).items():
        prop.pop("title", None)
        if name in described:
            prop["description"] = described[name]
    parameters.pop("additionalProperties", None)
    return {
        "type": "function",
        "function": {"name": fn.__name__, "description": doc.split("\n\n")[0].strip(), "parameters": parameters},
    }


def _arg_docs(doc: str) -> dict[str, str]:
    """Google-style `Args:` entries: `name: description`."""
    section = re.search(r"^\s*Args:\s*\n(.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
    if not section:
        return {}
    return {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\s*(\w+)(?:\s*\([^)]*\))?:\s*(.+)$", section.group(1), re.M)
    }


def _surrogate(value: Any, where: str = "") -> tuple[str, str, int] | None:
    """The first lone surrogate in a call's arguments, keys too: (where, the character, its index), or None."""
    if isinstance(value, str):
        return next(((where or "arguments", c, i) for i, c in enumerate(value) if "\ud800" <= c <= "\udfff"), None)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if found := _surrogate(key, f"{where or 'arguments'} (a key)") if isinstance(key, str) else None:
            return found  # never the key's own text, which no UTF-8 message can carry either
        if found := _surrogate(item, f"{where}.{key}" if where else str(key)):
            return found
    return None


class Toolbox:
    """Named tools with schemas; `call` runs one model tool call and always returns text."""

    def __init__(self, tools: list[Callable], timeout: float = 30.0):
        self.tools = {fn.__name__: fn for fn in tools}
        self.adapters = {name: TypeAdapter(fn) for name, fn in self.tools.items()}
        self.schemas = [tool_schema(fn) for fn in tools]
        self.timeout = timeout

    async def call(self, name: str, arguments: str | dict) -> tuple[str, bool]:
        """(observation, ok). Errors come back as `error: ...` observations with ok = False: the model's (a bad
        argument) named as its, the tool's own (it raised, timed out by itself, exited, returned what JSON cannot
        hold) as the tool's."""
        if name not in self.tools:
            return f"error: unknown tool {name!r}; available: {', '.join(self.tools)}", False
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as exc:
            return f"error: arguments are not valid JSON: {exc.msg}", False
        if not isinstance(args, dict):
            return "error: arguments must be a JSON object", False
        if found := _surrogate(args):  # JSON's "\ud800": in a result or the outcome, it fails the gateway's finish
            where, char, at = found
            return f"error: {where} holds {char!r} at character {at}, a lone surrogate no UTF-8 text can carry", False
        fn, adapter = self.tools[name], self.adapters[name]
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                if inspect.iscoroutinefunction(fn):
                    result = await _no_exit(adapter.validate_python(args))
                else:  # a blocking tool must not stall every other episode on the event loop
                    result = await _in_thread(adapter.validate_python, args)
            return (result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)), True
        except ValidationError as exc:
            if exc.title != f"call[{fn.__name__}]":  # the tool's own validation of something else
                return f"error: {name} raised ValidationError: {exc}", False
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return f"error: {name}: argument {where}: {first['msg']}", False
        except TimeoutError as exc:
            if deadline.expired():
                return f"error: {name} timed out after {self.timeout} s", False
            return f"error: {name} raised TimeoutError: {exc}", False  # its own (a socket's, a wait_for's)
        except Exception as exc:  # the tool's own bug is an observation, not a crash
            return f"error: {name} raised {type(exc).__name__}: {exc}", False


async def _no_exit(coroutine):
    """An async tool's sys.exit (argparse on arguments it refuses) as an error, not the end of the process."""
    try:
        return await coroutine
    except SystemExit as exc:
        raise _exited(exc) from None


def _exited(exc: SystemExit) -> RuntimeError:
    return RuntimeError(f"the tool called sys.exit({exc.code!r})")


def _in_thread(fn: Callable, *args) -> asyncio.Future:
    """`fn(*args)` in a daemon thread of its own, not the loop's pool: a blocking tool that outlives its timeout
    (a thread cannot be stopped) holds no pool worker, so later calls neither queue behind it nor time out waiting,
    and it does not keep the process from exiting. It may still finish late and change its harness's state: a
    tool that can hang should bound itself (a subprocess with a timeout)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    context = contextvars.copy_context()

    def settle(result, error) -> None:
        if not future.done():  # abandoned by its timeout
            future.set_exception(error) if error is not None else future.set_result(result)

    def run() -> None:
        try:
            outcome = (context.run(fn, *args), None)
        except SystemExit as exc:  # argparse on arguments it refuses: the tool's error, not the process's end
            outcome = (None, _exited(exc))
        except StopIteration as exc:  # a future cannot hold it (TypeError): it would never settle
            outcome = (None, RuntimeError(f"StopIteration: {exc}"))
        except BaseException as exc:  # the tool's own error: the caller's observation
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed while the tool ran
            pass

    threading.Thread(target=run, daemon=True, name=f"tool-{getattr(fn, '__name__', 'call')}").start()
    return future


def matching(pattern: str, items: Iterable[tuple[T, str]], seconds: float) -> Iterator[T]:
    """The items whose text a model's case-insensitive regex matches, lazily and in order, all of them within
    `seconds`; past it a ValueError (the tool's error observation). The `regex` package's timeout: `re` holds the
    GIL while a pattern such as `\\b(a|aa)+\\b\\.` backtracks, so no tool timeout could stop it and every episode
    of the process would hang. A bad pattern is `regex.error` here, before any item is read."""
    compiled = regex.compile(pattern, regex.I)
    return _matches(compiled, items, time.monotonic() + seconds, seconds)


def _matches(compiled, items: Iterable[tuple[T, str]], deadline: float, seconds: float) -> Iterator[T]:
    for item, text in items:
        try:
            hit = compiled.search(text, timeout=max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise ValueError(f"the pattern took over {seconds:.3g} s (nested repeats backtrack); simplify it") from None
        if hit:
            yield item
