"""Parsers for small text formats: key/value lines, CSV lines, durations, versions, query strings."""

from urllib.parse import unquote_plus


def parse_key_values(text: str) -> dict[str, str]:
    """Parse ``key = value`` lines into a dict, skipping blank lines and ``#`` comments.

    Only the first ``=`` separates the key from the value, both are stripped, and a
    later line overrides an earlier one with the same key.

    >>> parse_key_values("name = demo\\n# a comment\\nurl = a=b")
    {'name': 'demo', 'url': 'a=b'}
    """
    result: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"line {number}: expected 'key = value', got {raw!r}")
        result[key] = value.strip()
    return result


def split_csv_line(line: str, delimiter: str = ",") -> list[str]:
    """Split one CSV line into fields, honouring double quotes and ``""`` escapes inside them.

    An empty line gives a single empty field.

    >>> split_csv_line('7,"Smith, J.","say ""hi"" now"')
    ['7', 'Smith, J.', 'say "hi" now']
    """
    fields: list[str] = []
    current: list[str] = []
    in_quotes = False
    i = 0
    while i < len(line):
        char = line[i]
        if in_quotes and char == '"' and i + 1 < len(line) and line[i + 1] == '"':
            current.append('"')
            i += 1
        elif char == '"':
            in_quotes = not in_quotes
        elif char == delimiter and not in_quotes:
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    if in_quotes:
        raise ValueError(f"unterminated quoted field in {line!r}")
    fields.append("".join(current))
    return fields


def parse_duration(text: str) -> int:
    """Parse a duration such as ``"1h30m"`` or ``"2d 45s"`` into a number of seconds.

    The units are d, h, m and s (case-insensitive); each may appear at most once,
    largest first, and spaces are ignored.

    >>> parse_duration("1h30m")
    5400
    >>> parse_duration("2d 45s")
    172845
    """
    units = "dhms"
    seconds = (86400, 3600, 60, 1)
    total = 0
    digits = ""
    last_rank = -1
    for char in text.replace(" ", "").lower():
        if char in "0123456789":
            digits += char
            continue
        rank = units.find(char)
        if rank == -1 or not digits or rank <= last_rank:
            raise ValueError(f"invalid duration: {text!r}")
        total += int(digits) * seconds[rank]
        digits = ""
        last_rank = rank
    if digits or last_rank == -1:
        raise ValueError(f"invalid duration: {text!r}")
    return total


def compare_versions(a: str, b: str) -> int:
    """Compare two semantic versions; return -1, 0 or 1 as ``a`` is older, equal or newer.

    A leading ``v`` is allowed and build metadata after ``+`` is ignored. A pre-release
    (``1.0.0-rc.1``) comes before its release; pre-release identifiers compare
    numerically when they are numbers, numbers before words, and a shorter list first.

    >>> compare_versions("1.10.0", "1.9.3")
    1
    >>> compare_versions("2.0.0-rc.1", "2.0.0")
    -1
    """
    keys = []
    for version in (a, b):
        core, _, pre = version.strip().removeprefix("v").split("+", 1)[0].partition("-")
        parts = core.split(".")
        if len(parts) != 3 or not all(part.isdecimal() for part in parts):
            raise ValueError(f"invalid version: {version!r}")
        release = [int(part) for part in parts]
        identifiers = [(0, int(x), "") if x.isdecimal() else (1, 0, x) for x in pre.split(".")] if pre else []
        keys.append((release, identifiers))
    (release_a, pre_a), (release_b, pre_b) = keys
    if release_a != release_b:
        return -1 if release_a < release_b else 1
    if pre_a == pre_b:
        return 0
    if not pre_a or not pre_b:
        return 1 if not pre_a else -1
    return -1 if pre_a < pre_b else 1


def parse_query_string(query: str) -> dict[str, list[str]]:
    """Parse a URL query string into a dict mapping each key to the list of its values.

    A leading ``?`` is ignored, pairs with an empty key are skipped, a key without ``=``
    gets the empty string, and ``+`` and percent escapes are decoded.

    >>> parse_query_string("?tag=a&tag=b&q=hello+world")
    {'tag': ['a', 'b'], 'q': ['hello world']}
    """
    if query.startswith("?"):
        query = query[1:]
    result: dict[str, list[str]] = {}
    for pair in query.split("&"):
        raw_key, _, raw_value = pair.partition("=")
        key = unquote_plus(raw_key)
        if not key:
            continue
        result.setdefault(key, []).append(unquote_plus(raw_value))
    return result


def parse_int_ranges(text: str) -> list[int]:
    """Expand non-negative integers and inclusive ranges such as ``"1-3,7"`` into a sorted list.

    Duplicates are removed, spaces and empty items are ignored, and a reversed
    range such as ``"5-2"`` is an error.

    >>> parse_int_ranges("1-3,7,10-11")
    [1, 2, 3, 7, 10, 11]
    >>> parse_int_ranges("5, 2-3, 3")
    [2, 3, 5]
    """
    numbers: set[int] = set()
    for item in text.split(","):
        start, sep, end = item.strip().partition("-")
        if not start and not sep:
            continue
        if not start.strip().isdecimal() or (sep and not end.strip().isdecimal()):
            raise ValueError(f"invalid range: {item.strip()!r}")
        low = int(start)
        high = int(end) if sep else low
        if low > high:
            raise ValueError(f"reversed range: {item.strip()!r}")
        numbers.update(range(low, high + 1))
    return sorted(numbers)
