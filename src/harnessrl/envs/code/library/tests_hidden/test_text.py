import pytest
from text import camel_to_snake, is_palindrome, longest_common_prefix, slugify, truncate, wrap_words


def same(actual, expected):
    """Equal in value AND exact type, recursively (defeats objects that override __eq__)."""
    assert type(actual) is type(expected), f"type {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            same(a, e)
    elif isinstance(expected, dict):
        assert sorted(map(repr, actual)) == sorted(map(repr, expected))
        for k in expected:
            same(actual[k], expected[k])
    else:
        assert repr(actual) == repr(expected)


def test_slugify_empty_string():
    same(slugify(""), "")


def test_slugify_only_punctuation():
    same(slugify("!!! ??? ..."), "")


def test_slugify_leading_and_trailing_separators():
    same(slugify("--Hello--World--"), "hello-world")


def test_slugify_strips_accents():
    same(slugify("Ça va? Très bien"), "ca-va-tres-bien")


def test_slugify_keeps_digits():
    same(slugify("Version 2.0 Release"), "version-2-0-release")


def test_slugify_custom_separator():
    same(slugify("Hello World Again", "_"), "hello_world_again")


def test_slugify_single_letter_words():
    same(slugify("a b c"), "a-b-c")


def test_slugify_drops_non_latin_script():
    same(slugify("日本 Tokyo 2024"), "tokyo-2024")


def test_truncate_exact_width_is_unchanged():
    same(truncate("abcdef", 6), "abcdef")


def test_truncate_one_over_width():
    same(truncate("abcdefg", 6), "abc...")


def test_truncate_strips_space_before_placeholder():
    same(truncate("ab   cdefgh", 8), "ab...")


def test_truncate_width_equal_to_placeholder():
    same(truncate("abcdef", 3), "...")


def test_truncate_width_below_placeholder_raises():
    with pytest.raises(ValueError):
        truncate("abcdef", 2)


def test_truncate_custom_placeholder():
    same(truncate("Hello world", 6, "…"), "Hello…")


def test_truncate_empty_placeholder():
    same(truncate("abcdef", 4, ""), "abcd")


def test_truncate_empty_text():
    same(truncate("", 5), "")


def test_wrap_words_empty_text():
    same(wrap_words("", 5), [])


def test_wrap_words_whitespace_only():
    same(wrap_words("   \n  ", 5), [])


def test_wrap_words_exact_fit():
    same(wrap_words("ab cd", 5), ["ab cd"])


def test_wrap_words_one_short_of_fit():
    same(wrap_words("ab cd", 4), ["ab", "cd"])


def test_wrap_words_long_word_alone():
    same(wrap_words("a verylongword b", 5), ["a", "verylongword", "b"])


def test_wrap_words_collapses_whitespace():
    same(wrap_words("one\n two   three", 9), ["one two", "three"])


def test_wrap_words_width_one():
    same(wrap_words("a b c", 1), ["a", "b", "c"])


def test_wrap_words_zero_width_raises():
    with pytest.raises(ValueError):
        wrap_words("a b", 0)


def test_is_palindrome_empty_string():
    same(is_palindrome(""), True)


def test_is_palindrome_single_character():
    same(is_palindrome("x"), True)


def test_is_palindrome_two_different_characters():
    same(is_palindrome("ab"), False)


def test_is_palindrome_sentence_with_punctuation():
    same(is_palindrome("Was it a car or a cat I saw?"), True)


def test_is_palindrome_mismatch_near_middle():
    same(is_palindrome("abcxba"), False)


def test_is_palindrome_trailing_punctuation():
    same(is_palindrome("racecar!!"), True)


def test_is_palindrome_only_punctuation():
    same(is_palindrome("!?!"), True)


def test_is_palindrome_digits():
    same(is_palindrome("12321"), True)
    same(is_palindrome("123421"), False)


def test_is_palindrome_unicode_case():
    same(is_palindrome("Ésé"), True)


def test_camel_to_snake_empty():
    same(camel_to_snake(""), "")


def test_camel_to_snake_already_snake():
    same(camel_to_snake("already_snake"), "already_snake")


def test_camel_to_snake_leading_acronym():
    same(camel_to_snake("HTTPServer"), "http_server")


def test_camel_to_snake_trailing_acronym():
    same(camel_to_snake("getHTTP"), "get_http")


def test_camel_to_snake_single_letters():
    same(camel_to_snake("A"), "a")
    same(camel_to_snake("aB"), "a_b")


def test_camel_to_snake_all_caps():
    same(camel_to_snake("ABC"), "abc")


def test_camel_to_snake_digit_before_capital():
    same(camel_to_snake("version2Update"), "version2_update")


def test_camel_to_snake_two_letter_acronym():
    same(camel_to_snake("IOError"), "io_error")


def test_camel_to_snake_capital_before_final_lowercase():
    same(camel_to_snake("ABc"), "a_bc")


def test_camel_to_snake_existing_underscore():
    same(camel_to_snake("Foo_Bar"), "foo_bar")


def test_longest_common_prefix_empty_list():
    same(longest_common_prefix([]), "")


def test_longest_common_prefix_single_string():
    same(longest_common_prefix(["alone"]), "alone")


def test_longest_common_prefix_identical_strings():
    same(longest_common_prefix(["same", "same"]), "same")


def test_longest_common_prefix_contains_empty_string():
    same(longest_common_prefix(["abc", ""]), "")


def test_longest_common_prefix_whole_shortest():
    same(longest_common_prefix(["prefix", "pre", "prepare"]), "pre")


def test_longest_common_prefix_differs_at_last_char():
    same(longest_common_prefix(["abc", "abd"]), "ab")


def test_longest_common_prefix_differs_in_later_string():
    same(longest_common_prefix(["abc", "abc", "xbc"]), "")


def test_longest_common_prefix_unicode():
    same(longest_common_prefix(["naïve", "naïf"]), "naï")


def test_longest_common_prefix_case_sensitive():
    same(longest_common_prefix(["Abc", "abc"]), "")
