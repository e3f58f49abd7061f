"""Number utilities: clamping, rounding, numeral systems, statistics and fractions."""

import math
from collections.abc import Sequence


def clamp(value: float, low: float, high: float) -> float:
    """Limit ``value`` to the closed interval from ``low`` to ``high``.

    >>> clamp(15, 0, 10)
    10
    >>> clamp(-2.5, -1.0, 1.0)
    -1.0
    """
    if low > high:
        raise ValueError(f"low ({low}) is greater than high ({high})")
    if value < low:
        return low
    if value > high:
        return high
    return value


def round_to_step(value: float, step: float) -> float:
    """Round ``value`` to the nearest multiple of ``step``, rounding halves away from zero.

    The result is ``n * step`` for an integer ``n``, so it has the type of ``step``.

    >>> round_to_step(7, 5)
    5
    >>> round_to_step(-1.375, 0.25)
    -1.5
    """
    if step <= 0:
        raise ValueError("step must be positive")
    quotient = abs(value) / step
    multiple = math.floor(quotient)
    if quotient - multiple >= 0.5:
        multiple += 1
    if value < 0:
        multiple = -multiple
    return multiple * step


def to_roman(number: int) -> str:
    """Write an integer from 1 to 3999 in Roman numerals.

    >>> to_roman(1994)
    'MCMXCIV'
    >>> to_roman(8)
    'VIII'
    """
    if not 1 <= number <= 3999:
        raise ValueError(f"Roman numerals cover 1 to 3999, got {number}")
    numerals = [
        (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
        (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
    ]  # fmt: skip
    parts: list[str] = []
    for amount, symbol in numerals:
        while number >= amount:
            parts.append(symbol)
            number -= amount
    return "".join(parts)


def to_base(number: int, base: int) -> str:
    """Write an integer in a base from 2 to 36, with digits 0-9 then lowercase letters.

    >>> to_base(255, 16)
    'ff'
    >>> to_base(-10, 2)
    '-1010'
    """
    if not 2 <= base <= 36:
        raise ValueError(f"base must be between 2 and 36, got {base}")
    if number == 0:
        return "0"
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    remaining = abs(number)
    out: list[str] = []
    while remaining > 0:
        remaining, remainder = divmod(remaining, base)
        out.append(digits[remainder])
    sign = "-" if number < 0 else ""
    return sign + "".join(reversed(out))


def median(values: Sequence[float]) -> float:
    """Return the median: the middle value, or the mean of the two middle values for an even count.

    >>> median([3, 1, 2])
    2
    >>> median([4, 1, 3, 2])
    2.5
    """
    if not values:
        raise ValueError("median of an empty sequence")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def simplify_fraction(numerator: int, denominator: int) -> tuple[int, int]:
    """Reduce a fraction to lowest terms, with a positive denominator.

    >>> simplify_fraction(6, 8)
    (3, 4)
    >>> simplify_fraction(3, -9)
    (-1, 3)
    """
    if denominator == 0:
        raise ValueError("denominator must not be zero")
    a, b = abs(numerator), abs(denominator)
    while b:
        a, b = b, a % b
    if denominator < 0:
        numerator, denominator = -numerator, -denominator
    return numerator // a, denominator // a
