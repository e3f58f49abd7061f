from collections_utils import binary_search, chunked, dedupe, deep_merge, flatten, sliding_windows


def test_chunked_even_split():
    assert chunked([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_chunked_uneven_split():
    assert chunked([1, 2, 3], 2) == [[1, 2], [3]]


def test_flatten_one_level():
    assert flatten([1, [2, 3], 4]) == [1, 2, 3, 4]


def test_flatten_already_flat():
    assert flatten([1, 2]) == [1, 2]


def test_dedupe_numbers():
    assert dedupe([1, 2, 1, 3]) == [1, 2, 3]


def test_dedupe_strings():
    assert dedupe(["b", "a", "b"]) == ["b", "a"]


def test_deep_merge_flat():
    assert deep_merge({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}


def test_deep_merge_nested():
    assert deep_merge({"a": {"x": 1}}, {"a": {"y": 2}}) == {"a": {"x": 1, "y": 2}}


def test_sliding_windows_pairs():
    assert sliding_windows([1, 2, 3], 2) == [(1, 2), (2, 3)]


def test_sliding_windows_whole_sequence():
    assert sliding_windows([1, 2, 3], 3) == [(1, 2, 3)]


def test_binary_search_found():
    assert binary_search([1, 2, 3, 4, 5], 4) == 3


def test_binary_search_missing():
    assert binary_search([1, 2, 3, 4, 5], 6) == -1
