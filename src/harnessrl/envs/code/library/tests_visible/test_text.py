from text import camel_to_snake, is_palindrome, longest_common_prefix, slugify, truncate, wrap_words


def test_slugify_basic_sentence():
    assert slugify("Hello World") == "hello-world"


def test_slugify_punctuation_collapses():
    assert slugify("Rock & Roll!") == "rock-roll"


def test_truncate_long_text():
    assert truncate("abcdefghij", 6) == "abc..."


def test_truncate_fits():
    assert truncate("abc", 6) == "abc"


def test_wrap_words_two_lines():
    assert wrap_words("one two three", 7) == ["one two", "three"]


def test_wrap_words_single_line():
    assert wrap_words("a b c", 10) == ["a b c"]


def test_is_palindrome_simple_word():
    assert is_palindrome("racecar") is True


def test_is_palindrome_not_palindrome():
    assert is_palindrome("hello") is False


def test_camel_to_snake_camel_case():
    assert camel_to_snake("helloWorld") == "hello_world"


def test_camel_to_snake_pascal_case():
    assert camel_to_snake("MyClassName") == "my_class_name"


def test_longest_common_prefix_shared():
    assert longest_common_prefix(["flower", "flow", "flight"]) == "fl"


def test_longest_common_prefix_none_shared():
    assert longest_common_prefix(["dog", "car"]) == ""
