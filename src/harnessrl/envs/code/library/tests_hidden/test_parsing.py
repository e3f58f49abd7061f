import pytest
from parsing import (
    compare_versions,
    parse_duration,
    parse_int_ranges,
    parse_key_values,
    parse_query_string,
    split_csv_line,
)


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


def test_parse_key_values_empty_text():
    same(parse_key_values(""), {})


def test_parse_key_values_skips_comments_and_blank_lines():
    same(parse_key_values("# top\n\n   # indented\nk=v\n   \n"), {"k": "v"})


def test_parse_key_values_splits_on_first_equals():
    same(parse_key_values("url=http://x/?a=b"), {"url": "http://x/?a=b"})


def test_parse_key_values_empty_value():
    same(parse_key_values("key ="), {"key": ""})


def test_parse_key_values_later_line_wins():
    same(parse_key_values("a=1\nb=2\na=3"), {"a": "3", "b": "2"})


def test_parse_key_values_hash_inside_value_kept():
    same(parse_key_values("color = #fff"), {"color": "#fff"})


def test_parse_key_values_windows_newlines():
    same(parse_key_values("a=1\r\nb=2\r\n"), {"a": "1", "b": "2"})


def test_parse_key_values_missing_equals_raises():
    with pytest.raises(ValueError, match="line 2"):
        parse_key_values("a=1\njust text")


def test_parse_key_values_empty_key_raises():
    with pytest.raises(ValueError):
        parse_key_values("  = value")


def test_split_csv_line_empty_line():
    same(split_csv_line(""), [""])


def test_split_csv_line_empty_middle_field():
    same(split_csv_line("a,,b"), ["a", "", "b"])


def test_split_csv_line_trailing_delimiter():
    same(split_csv_line("a,b,"), ["a", "b", ""])


def test_split_csv_line_escaped_quotes():
    same(split_csv_line('"a ""quoted"" word",x'), ['a "quoted" word', "x"])


def test_split_csv_line_empty_quoted_field():
    same(split_csv_line('"",x'), ["", "x"])


def test_split_csv_line_field_that_is_only_quotes():
    same(split_csv_line('"""a"""'), ['"a"'])


def test_split_csv_line_quoted_last_field():
    same(split_csv_line('x,"y"'), ["x", "y"])


def test_split_csv_line_other_delimiter():
    same(split_csv_line('a;"b;c";d', ";"), ["a", "b;c", "d"])


def test_split_csv_line_unicode():
    same(split_csv_line("é,ü,中"), ["é", "ü", "中"])


def test_split_csv_line_unterminated_quote_raises():
    with pytest.raises(ValueError):
        split_csv_line('a,"b')


def test_parse_duration_zero():
    same(parse_duration("0s"), 0)


def test_parse_duration_days_only():
    same(parse_duration("1d"), 86400)


def test_parse_duration_all_units():
    same(parse_duration("1d2h3m4s"), 93784)


def test_parse_duration_not_normalised():
    same(parse_duration("90m"), 5400)
    same(parse_duration("100s"), 100)


def test_parse_duration_uppercase_and_spaces():
    same(parse_duration(" 1H  5M "), 3900)


def test_parse_duration_empty_raises():
    with pytest.raises(ValueError):
        parse_duration("")


def test_parse_duration_number_without_unit_raises():
    with pytest.raises(ValueError):
        parse_duration("10")
    with pytest.raises(ValueError):
        parse_duration("1h30")


def test_parse_duration_unit_without_number_raises():
    with pytest.raises(ValueError):
        parse_duration("m")


def test_parse_duration_wrong_order_raises():
    with pytest.raises(ValueError):
        parse_duration("1m1h")


def test_parse_duration_repeated_unit_raises():
    with pytest.raises(ValueError):
        parse_duration("1h1h")


def test_parse_duration_unknown_unit_raises():
    with pytest.raises(ValueError):
        parse_duration("5w")


def test_compare_versions_major_dominates():
    same(compare_versions("2.0.0", "1.99.99"), 1)
    same(compare_versions("1.99.99", "2.0.0"), -1)


def test_compare_versions_numeric_not_lexicographic():
    same(compare_versions("1.2.10", "1.2.9"), 1)
    same(compare_versions("0.9.0", "0.10.0"), -1)


def test_compare_versions_prefix_and_build_ignored():
    same(compare_versions("v1.0.0", "1.0.0"), 0)
    same(compare_versions("1.0.0+build.5", "1.0.0+build.7"), 0)


def test_compare_versions_release_after_prerelease():
    same(compare_versions("1.0.0", "1.0.0-alpha"), 1)
    same(compare_versions("1.0.0-alpha", "1.0.0"), -1)


def test_compare_versions_prerelease_precedence_chain():
    chain = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
    ]
    for older, newer in zip(chain, chain[1:]):
        same(compare_versions(older, newer), -1)
        same(compare_versions(newer, older), 1)


def test_compare_versions_equal_prereleases():
    same(compare_versions("3.1.4-rc.2", "3.1.4-rc.2"), 0)


def test_compare_versions_release_part_before_prerelease():
    same(compare_versions("1.0.1-alpha", "1.0.0"), 1)


def test_compare_versions_invalid_raises():
    for bad in ["1.2", "1.2.x", "", "1.2.3.4"]:
        with pytest.raises(ValueError):
            compare_versions(bad, "1.0.0")
    with pytest.raises(ValueError):
        compare_versions("1.0.0", "1..0")


def test_parse_query_string_empty():
    same(parse_query_string(""), {})
    same(parse_query_string("?"), {})


def test_parse_query_string_leading_question_mark():
    same(parse_query_string("?a=1"), {"a": ["1"]})


def test_parse_query_string_only_one_question_mark_removed():
    same(parse_query_string("??a=1"), {"?a": ["1"]})


def test_parse_query_string_keys_without_values():
    same(parse_query_string("flag&a=&b"), {"flag": [""], "a": [""], "b": [""]})


def test_parse_query_string_skips_empty_pairs_and_keys():
    same(parse_query_string("&&=x&a=1&&"), {"a": ["1"]})


def test_parse_query_string_decodes_escapes():
    same(parse_query_string("name=J%C3%BCrgen+M&x%20y=1"), {"name": ["Jürgen M"], "x y": ["1"]})


def test_parse_query_string_value_with_equals():
    same(parse_query_string("eq=a=b"), {"eq": ["a=b"]})


def test_parse_query_string_interleaved_repeats():
    same(parse_query_string("a=1&b=2&a=3"), {"a": ["1", "3"], "b": ["2"]})


def test_parse_int_ranges_empty():
    same(parse_int_ranges(""), [])
    same(parse_int_ranges(" , ,"), [])


def test_parse_int_ranges_zero():
    same(parse_int_ranges("0"), [0])
    same(parse_int_ranges("0-2"), [0, 1, 2])


def test_parse_int_ranges_single_value_range():
    same(parse_int_ranges("3-3"), [3])


def test_parse_int_ranges_overlapping():
    same(parse_int_ranges("1-4,3-6"), [1, 2, 3, 4, 5, 6])


def test_parse_int_ranges_spaces_around_dash():
    same(parse_int_ranges(" 1 - 3 "), [1, 2, 3])


def test_parse_int_ranges_number_inside_range():
    same(parse_int_ranges("10, 9-10"), [9, 10])


def test_parse_int_ranges_reversed_range_raises():
    with pytest.raises(ValueError):
        parse_int_ranges("5-2")


def test_parse_int_ranges_malformed_raises():
    for bad in ["-3", "a", "1-", "1-2-3", "1,x"]:
        with pytest.raises(ValueError):
            parse_int_ranges(bad)
