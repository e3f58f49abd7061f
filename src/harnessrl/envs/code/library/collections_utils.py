"""Utilities for lists, sequences and dicts."""

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    """Split items into consecutive lists of ``size`` elements; the last one may be shorter.

    >>> chunked([1, 2, 3, 4, 5], 2)
    [[1, 2], [3, 4], [5]]
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    chunks: list[list[T]] = []
    for start in range(0, len(items), size):
        chunks.append(list(items[start : start + size]))
    return chunks


def flatten(nested: Iterable[Any], depth: int | None = None) -> list[Any]:
    """Flatten nested lists and tuples into one list, at most ``depth`` levels deep (all if None).

    Strings, dicts and other objects are kept as single elements.

    >>> flatten([1, [2, [3, [4]]], (5,)])
    [1, 2, 3, 4, 5]
    >>> flatten([1, [2, [3, [4]]]], depth=1)
    [1, 2, [3, [4]]]
    """
    result: list[Any] = []
    for item in nested:
        if isinstance(item, (list, tuple)) and (depth is None or depth > 0):
            result.extend(flatten(item, None if depth is None else depth - 1))
        else:
            result.append(item)
    return result


def dedupe(items: Iterable[T], key: Callable[[T], Hashable] | None = None) -> list[T]:
    """Remove duplicates, keeping the first occurrence of each item and the original order.

    ``key``, when given, computes the value that decides whether two items are duplicates.

    >>> dedupe([3, 1, 3, 2, 1])
    [3, 1, 2]
    >>> dedupe(["a", "B", "b", "A"], key=str.lower)
    ['a', 'B']
    """
    seen: set[Hashable] = set()
    result: list[T] = []
    for item in items:
        marker = item if key is None else key(item)
        if marker not in seen:
            seen.add(marker)
            result.append(item)
    return result


def deep_merge(base: Mapping[Any, Any], override: Mapping[Any, Any]) -> dict[Any, Any]:
    """Return a new dict with ``override`` merged into ``base``, recursing into nested dicts.

    Values from ``override`` win, except that two dicts under the same key are merged
    in turn. Neither input is modified.

    >>> deep_merge({"db": {"host": "x", "port": 1}}, {"db": {"port": 2}, "debug": True})
    {'db': {'host': 'x', 'port': 2}, 'debug': True}
    """
    merged = dict(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = value
    return merged


def sliding_windows(items: Sequence[T], size: int, step: int = 1) -> list[tuple[T, ...]]:
    """Return every full window of ``size`` consecutive items, moving ``step`` items at a time.

    >>> sliding_windows([1, 2, 3, 4], 2)
    [(1, 2), (2, 3), (3, 4)]
    >>> sliding_windows("abcdefg", 3, step=2)
    [('a', 'b', 'c'), ('c', 'd', 'e'), ('e', 'f', 'g')]
    """
    if size < 1 or step < 1:
        raise ValueError("size and step must be at least 1")
    windows: list[tuple[T, ...]] = []
    start = 0
    while start + size <= len(items):
        windows.append(tuple(items[start : start + size]))
        start += step
    return windows


def binary_search(items: Sequence[Any], target: Any) -> int:
    """Return the index of the first occurrence of ``target`` in the sorted ``items``, or -1.

    >>> binary_search([1, 3, 3, 3, 7], 3)
    1
    >>> binary_search([1, 3, 7], 4)
    -1
    """
    low, high = 0, len(items)
    while low < high:
        middle = (low + high) // 2
        if items[middle] < target:
            low = middle + 1
        else:
            high = middle
    if low < len(items) and items[low] == target:
        return low
    return -1
