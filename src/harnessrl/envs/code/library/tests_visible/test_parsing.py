from parsing import (
    compare_versions,
    parse_duration,
    parse_int_ranges,
    parse_key_values,
    parse_query_string,
    split_csv_line,
)


def test_parse_key_values_two_lines():
    assert parse_key_values("a=1\nb=2") == {"a": "1", "b": "2"}


def test_parse_key_values_strips_spaces():
    assert parse_key_values("  host =  localhost  ") == {"host": "localhost"}


def test_split_csv_line_plain():
    assert split_csv_line("a,b,c") == ["a", "b", "c"]


def test_split_csv_line_quoted_comma():
    assert split_csv_line('x,"y,z"') == ["x", "y,z"]


def test_parse_duration_minutes():
    assert parse_duration("15m") == 900


def test_parse_duration_hours_and_seconds():
    assert parse_duration("2h10s") == 7210


def test_compare_versions_equal():
    assert compare_versions("1.2.3", "1.2.3") == 0


def test_compare_versions_patch_older():
    assert compare_versions("1.2.3", "1.2.4") == -1


def test_parse_query_string_simple():
    assert parse_query_string("a=1&b=2") == {"a": ["1"], "b": ["2"]}


def test_parse_query_string_repeated_key():
    assert parse_query_string("x=1&x=2") == {"x": ["1", "2"]}


def test_parse_int_ranges_single_range():
    assert parse_int_ranges("4-6") == [4, 5, 6]


def test_parse_int_ranges_single_numbers():
    assert parse_int_ranges("9,2") == [2, 9]
