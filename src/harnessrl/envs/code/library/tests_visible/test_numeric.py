from numeric import clamp, median, round_to_step, simplify_fraction, to_base, to_roman


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_below():
    assert clamp(-3, 0, 10) == 0


def test_round_to_step_down():
    assert round_to_step(12, 10) == 10


def test_round_to_step_up():
    assert round_to_step(18, 10) == 20


def test_to_roman_small():
    assert to_roman(3) == "III"


def test_to_roman_year():
    assert to_roman(2024) == "MMXXIV"


def test_to_base_binary():
    assert to_base(5, 2) == "101"


def test_to_base_hex():
    assert to_base(26, 16) == "1a"


def test_median_odd():
    assert median([5, 1, 3]) == 3


def test_median_even():
    assert median([1, 2, 3, 4]) == 2.5


def test_simplify_fraction_basic():
    assert simplify_fraction(2, 4) == (1, 2)


def test_simplify_fraction_already_reduced():
    assert simplify_fraction(3, 7) == (3, 7)
