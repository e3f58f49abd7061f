import pytest
from collections_utils import binary_search, chunked, dedupe, deep_merge, flatten, sliding_windows


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


def test_chunked_empty():
    same(chunked([], 3), [])


def test_chunked_size_one():
    same(chunked([1, 2, 3], 1), [[1], [2], [3]])


def test_chunked_size_larger_than_input():
    same(chunked([1, 2], 5), [[1, 2]])


def test_chunked_size_equal_to_input():
    same(chunked([4, 5, 6], 3), [[4, 5, 6]])


def test_chunked_one_more_than_multiple():
    same(chunked([1, 2, 3, 4, 5, 6, 7], 3), [[1, 2, 3], [4, 5, 6], [7]])


def test_chunked_tuple_and_string_input_give_lists():
    same(chunked((1, 2, 3), 2), [[1, 2], [3]])
    same(chunked("abcde", 2), [["a", "b"], ["c", "d"], ["e"]])


def test_chunked_invalid_size_raises():
    with pytest.raises(ValueError):
        chunked([1, 2], 0)
    with pytest.raises(ValueError):
        chunked([1, 2], -1)


def test_flatten_empty():
    same(flatten([]), [])


def test_flatten_deeply_nested():
    same(flatten([[[[1]]], [[2]]]), [1, 2])


def test_flatten_depth_zero_keeps_structure():
    same(flatten([1, [2]], depth=0), [1, [2]])


def test_flatten_depth_two():
    same(flatten([1, [2, [3, [4]]]], depth=2), [1, 2, 3, [4]])


def test_flatten_keeps_strings_and_dicts():
    same(flatten(["ab", ["cd", {"k": [1]}]]), ["ab", "cd", {"k": [1]}])


def test_flatten_tuples():
    same(flatten([(1, 2), [(3,)]]), [1, 2, 3])


def test_flatten_drops_empty_lists():
    same(flatten([[], [[]], 1, [[], 2]]), [1, 2])


def test_flatten_accepts_iterator():
    same(flatten(iter([0, [None]])), [0, None])


def test_dedupe_empty():
    same(dedupe([]), [])


def test_dedupe_all_equal():
    same(dedupe([7, 7, 7]), [7])


def test_dedupe_no_duplicates_keeps_order():
    same(dedupe([3, 2, 1]), [3, 2, 1])


def test_dedupe_key_keeps_first_original_item():
    same(dedupe(["X", "x", "y", "Y"], key=str.lower), ["X", "y"])


def test_dedupe_key_function():
    words = ["apple", "avocado", "banana", "blueberry", "cherry"]
    same(dedupe(words, key=lambda word: word[0]), ["apple", "banana", "cherry"])


def test_dedupe_tuples():
    same(dedupe([(1, 2), (1, 2), (2, 1)]), [(1, 2), (2, 1)])


def test_dedupe_falsy_values():
    same(dedupe([None, 0, None, "", 0]), [None, 0, ""])


def test_dedupe_accepts_generator():
    same(dedupe(x % 3 for x in range(7)), [0, 1, 2])


def test_deep_merge_both_empty():
    same(deep_merge({}, {}), {})


def test_deep_merge_override_scalar_wins():
    same(deep_merge({"a": 1, "b": 2}, {"a": 3}), {"a": 3, "b": 2})


def test_deep_merge_dict_replaces_scalar():
    same(deep_merge({"a": 1}, {"a": {"b": 2}}), {"a": {"b": 2}})


def test_deep_merge_scalar_replaces_dict():
    same(deep_merge({"a": {"b": 1}}, {"a": 5}), {"a": 5})


def test_deep_merge_three_levels():
    base = {"a": {"b": {"c": 1, "d": 2}, "e": 0}}
    same(deep_merge(base, {"a": {"b": {"d": 3}}}), {"a": {"b": {"c": 1, "d": 3}, "e": 0}})


def test_deep_merge_lists_are_replaced():
    same(deep_merge({"a": [1, 2]}, {"a": [3]}), {"a": [3]})


def test_deep_merge_none_overrides():
    same(deep_merge({"a": 1}, {"a": None}), {"a": None})


def test_deep_merge_does_not_modify_inputs():
    base = {"a": {"x": 1}, "b": 1}
    override = {"a": {"y": 2}, "c": 3}
    result = deep_merge(base, override)
    same(result, {"a": {"x": 1, "y": 2}, "b": 1, "c": 3})
    same(base, {"a": {"x": 1}, "b": 1})
    same(override, {"a": {"y": 2}, "c": 3})
    same(deep_merge(base, {}) is base, False)


def test_sliding_windows_empty():
    same(sliding_windows([], 2), [])


def test_sliding_windows_size_larger_than_input():
    same(sliding_windows([1, 2], 3), [])


def test_sliding_windows_size_equal_to_input():
    same(sliding_windows([1, 2, 3, 4], 4), [(1, 2, 3, 4)])


def test_sliding_windows_size_one():
    same(sliding_windows([7, 8, 9], 1), [(7,), (8,), (9,)])


def test_sliding_windows_step_larger_than_size():
    same(sliding_windows(list(range(7)), 2, step=3), [(0, 1), (3, 4)])


def test_sliding_windows_step_drops_partial_tail():
    same(sliding_windows([1, 2, 3, 4, 5], 2, step=2), [(1, 2), (3, 4)])


def test_sliding_windows_string_input():
    same(sliding_windows("abc", 2), [("a", "b"), ("b", "c")])


def test_sliding_windows_invalid_arguments_raise():
    with pytest.raises(ValueError):
        sliding_windows([1, 2], 0)
    with pytest.raises(ValueError):
        sliding_windows([1, 2], 1, step=0)


def test_binary_search_empty():
    same(binary_search([], 1), -1)


def test_binary_search_single_element():
    same(binary_search([5], 5), 0)
    same(binary_search([5], 3), -1)
    same(binary_search([5], 8), -1)


def test_binary_search_first_and_last():
    same(binary_search([1, 3, 5, 7], 1), 0)
    same(binary_search([1, 3, 5, 7], 7), 3)


def test_binary_search_leftmost_duplicate():
    same(binary_search([2, 2, 2, 2], 2), 0)
    same(binary_search([1, 2, 2, 2, 3], 2), 1)
    same(binary_search([0, 1, 1, 1, 1, 1, 1, 9], 1), 1)


def test_binary_search_missing_between_and_outside():
    same(binary_search([10, 20, 30], 25), -1)
    same(binary_search([10, 20, 30], 5), -1)
    same(binary_search([10, 20, 30], 35), -1)


def test_binary_search_negative_numbers():
    same(binary_search([-5, -3, 0, 4], -3), 1)


def test_binary_search_strings():
    same(binary_search(["a", "c", "e", "g"], "e"), 2)
