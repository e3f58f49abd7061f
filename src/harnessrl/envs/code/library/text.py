"""String utilities."""

import unicodedata


def slugify(text: str, separator: str = "-") -> str:
    """Turn text into a lowercase ASCII slug whose words are joined by ``separator``.

    Accents are stripped, every run of characters other than ASCII letters and digits
    becomes a single separator, and the slug never starts or ends with a separator.

    >>> slugify("Hello, World!")
    'hello-world'
    >>> slugify("  Crème brûlée  ", "_")
    'creme_brulee'
    """
    words: list[str] = []
    current: list[str] = []
    for char in unicodedata.normalize("NFKD", text).lower():
        if unicodedata.combining(char):
            continue
        if char.isascii() and char.isalnum():
            current.append(char)
        elif current:
            words.append("".join(current))
            current = []
    if current:
        words.append("".join(current))
    return separator.join(words)


def truncate(text: str, width: int, placeholder: str = "...") -> str:
    """Shorten text to at most ``width`` characters, ending it with ``placeholder`` when cut.

    Text that already fits is returned unchanged; whitespace left before the
    placeholder is dropped.

    >>> truncate("Hello, world", 8)
    'Hello...'
    >>> truncate("short", 10)
    'short'
    """
    if width < len(placeholder):
        raise ValueError("width is smaller than the placeholder")
    if len(text) <= width:
        return text
    return text[: width - len(placeholder)].rstrip() + placeholder


def wrap_words(text: str, width: int) -> list[str]:
    """Greedily wrap the words of text into lines of at most ``width`` characters.

    Words are separated by single spaces; a word longer than ``width`` gets a line of
    its own and is not broken.

    >>> wrap_words("the quick brown fox jumps", 10)
    ['the quick', 'brown fox', 'jumps']
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def is_palindrome(text: str) -> bool:
    """Tell whether text reads the same backwards, ignoring case and non-alphanumeric characters.

    >>> is_palindrome("A man, a plan, a canal: Panama")
    True
    >>> is_palindrome("palindrome")
    False
    """
    left, right = 0, len(text) - 1
    while left < right:
        if not text[left].isalnum():
            left += 1
        elif not text[right].isalnum():
            right -= 1
        elif text[left].casefold() != text[right].casefold():
            return False
        else:
            left += 1
            right -= 1
    return True


def camel_to_snake(name: str) -> str:
    """Convert a camelCase or PascalCase identifier to snake_case.

    A run of capitals is kept together as one word (an acronym), and digits stay
    attached to the word before them.

    >>> camel_to_snake("parseHTTPResponse")
    'parse_http_response'
    >>> camel_to_snake("UserID2Name")
    'user_id2_name'
    """
    out: list[str] = []
    for i, char in enumerate(name):
        if char.isupper() and i > 0:
            previous = name[i - 1]
            next_is_lower = i + 1 < len(name) and name[i + 1].islower()
            if previous.islower() or previous.isdigit() or (previous.isupper() and next_is_lower):
                out.append("_")
        out.append(char.lower())
    return "".join(out)


def longest_common_prefix(strings: list[str]) -> str:
    """Return the longest prefix shared by all the strings ("" for an empty list).

    >>> longest_common_prefix(["interview", "internet", "interval"])
    'inter'
    >>> longest_common_prefix(["apple", "banana"])
    ''
    """
    if not strings:
        return ""
    shortest = min(strings, key=len)
    for i, char in enumerate(shortest):
        for other in strings:
            if other[i] != char:
                return shortest[:i]
    return shortest
