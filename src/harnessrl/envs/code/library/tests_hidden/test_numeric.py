import pytest
from numeric import clamp, median, round_to_step, simplify_fraction, to_base, to_roman


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


def test_clamp_at_low_bound_returns_value():
    same(clamp(0.0, 0, 10), 0.0)


def test_clamp_at_high_bound_returns_value():
    same(clamp(10.0, 0, 10), 10.0)


def test_clamp_above_high():
    same(clamp(11, 0, 10), 10)


def test_clamp_negative_range():
    same(clamp(-7, -5, -1), -5)
    same(clamp(0, -5, -1), -1)


def test_clamp_float_bounds():
    same(clamp(0.75, 0.0, 0.5), 0.5)
    same(clamp(-0.25, 0.0, 0.5), 0.0)


def test_clamp_equal_bounds():
    same(clamp(3, 4, 4), 4)
    same(clamp(5, 4, 4), 4)


def test_clamp_low_above_high_raises():
    with pytest.raises(ValueError):
        clamp(1, 5, 4)


def test_round_to_step_half_rounds_away_from_zero():
    same(round_to_step(15, 10), 20)
    same(round_to_step(-15, 10), -20)


def test_round_to_step_just_below_half():
    same(round_to_step(14, 10), 10)
    same(round_to_step(-14, 10), -10)


def test_round_to_step_small_negative_gives_zero():
    same(round_to_step(-4, 10), 0)
    same(round_to_step(-0.2, 0.5), 0.0)


def test_round_to_step_negative_fraction_rounds_away():
    same(round_to_step(-0.75, 0.5), -1.0)
    same(round_to_step(-0.5, 0.25), -0.5)


def test_round_to_step_float_step():
    same(round_to_step(2.6, 0.5), 2.5)
    same(round_to_step(0.75, 0.5), 1.0)


def test_round_to_step_exact_multiple_and_zero():
    same(round_to_step(30, 10), 30)
    same(round_to_step(0, 3), 0)


def test_round_to_step_step_one():
    same(round_to_step(2.5, 1), 3)
    same(round_to_step(-2.4, 1), -2)


def test_round_to_step_non_positive_step_raises():
    with pytest.raises(ValueError):
        round_to_step(5, 0)
    with pytest.raises(ValueError):
        round_to_step(5, -1)


def test_to_roman_one():
    same(to_roman(1), "I")


def test_to_roman_subtractive_pairs():
    cases = {4: "IV", 9: "IX", 40: "XL", 90: "XC", 400: "CD", 900: "CM"}
    for number, expected in cases.items():
        same(to_roman(number), expected)


def test_to_roman_next_to_subtractive_pairs():
    cases = {5: "V", 10: "X", 39: "XXXIX", 41: "XLI", 50: "L", 89: "LXXXIX", 100: "C", 500: "D", 1000: "M"}
    for number, expected in cases.items():
        same(to_roman(number), expected)


def test_to_roman_mixed_values():
    same(to_roman(49), "XLIX")
    same(to_roman(444), "CDXLIV")
    same(to_roman(1666), "MDCLXVI")


def test_to_roman_maximum():
    same(to_roman(3999), "MMMCMXCIX")


def test_to_roman_out_of_range_raises():
    for bad in [0, -1, 4000]:
        with pytest.raises(ValueError):
            to_roman(bad)


def test_to_base_zero():
    same(to_base(0, 7), "0")


def test_to_base_base_36():
    same(to_base(35, 36), "z")
    same(to_base(36, 36), "10")


def test_to_base_digit_boundary():
    same(to_base(7, 8), "7")
    same(to_base(8, 8), "10")
    same(to_base(9, 10), "9")


def test_to_base_negative():
    same(to_base(-255, 16), "-ff")
    same(to_base(-1, 2), "-1")


def test_to_base_decimal_identity():
    same(to_base(1234, 10), "1234")


def test_to_base_large_number():
    same(to_base(2**64, 16), "1" + "0" * 16)


def test_to_base_invalid_base_raises():
    for bad in [1, 37, 0]:
        with pytest.raises(ValueError):
            to_base(10, bad)


def test_median_single_value():
    same(median([7]), 7)


def test_median_two_values():
    same(median([1, 2]), 1.5)


def test_median_even_unsorted_with_ties():
    same(median([10, 2, 38, 23, 38, 23]), 23.0)


def test_median_negative_values():
    same(median([-5, -1, -3]), -3)


def test_median_floats():
    same(median([0.5, 0.25]), 0.375)


def test_median_tuple_input():
    same(median((9, 1, 5, 3)), 4.0)


def test_median_repeated_values():
    same(median([1, 1, 1, 2]), 1.0)
    same(median([2, 1, 1, 1, 2]), 1)


def test_median_empty_raises():
    with pytest.raises(ValueError):
        median([])


def test_simplify_fraction_zero_numerator():
    same(simplify_fraction(0, 5), (0, 1))
    same(simplify_fraction(0, -3), (0, 1))


def test_simplify_fraction_negative_numerator():
    same(simplify_fraction(-4, 6), (-2, 3))


def test_simplify_fraction_both_negative():
    same(simplify_fraction(-4, -6), (2, 3))


def test_simplify_fraction_denominator_one():
    same(simplify_fraction(5, 1), (5, 1))
    same(simplify_fraction(12, 4), (3, 1))
    same(simplify_fraction(5, -1), (-5, 1))


def test_simplify_fraction_large_gcd():
    same(simplify_fraction(1071, 462), (51, 22))


def test_simplify_fraction_equal_parts():
    same(simplify_fraction(7, 7), (1, 1))
    same(simplify_fraction(-7, 7), (-1, 1))


def test_simplify_fraction_zero_denominator_raises():
    with pytest.raises(ValueError):
        simplify_fraction(1, 0)
