"""An argparse type the benchmarks and examples share: it refuses a count they cannot run with, at parse time
(`--repeats 0` used to run a whole benchmark, then fail on the median of nothing)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(low: int) -> Callable[[str], int]:
    """An argparse `type`: a whole number >= low, else the usage error `argument --X: at least LOW, got N`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"at least {low}, got {value}")
        return value

    return parse
