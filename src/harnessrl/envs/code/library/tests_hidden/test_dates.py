from datetime import date

import pytest
from dates import add_months, age_on, business_days_between, days_in_month, is_leap_year, nth_weekday


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


def test_is_leap_year_divisible_by_400():
    same(is_leap_year(2000), True)
    same(is_leap_year(2400), True)


def test_is_leap_year_century_not_leap():
    same(is_leap_year(2100), False)
    same(is_leap_year(1800), False)


def test_is_leap_year_ordinary_leap():
    same(is_leap_year(1996), True)
    same(is_leap_year(2004), True)


def test_is_leap_year_odd_and_even_common_years():
    same(is_leap_year(2019), False)
    same(is_leap_year(2022), False)


def test_is_leap_year_year_zero_and_negative():
    same(is_leap_year(0), True)
    same(is_leap_year(-4), True)
    same(is_leap_year(-1), False)


def test_days_in_month_december():
    same(days_in_month(2023, 12), 31)


def test_days_in_month_february_century_years():
    same(days_in_month(1900, 2), 28)
    same(days_in_month(2000, 2), 29)
    same(days_in_month(2028, 2), 29)


def test_days_in_month_november():
    same(days_in_month(2024, 11), 30)


def test_days_in_month_july_and_august():
    same(days_in_month(2024, 7), 31)
    same(days_in_month(2024, 8), 31)


def test_days_in_month_every_month_of_common_year():
    expected = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    same([days_in_month(2025, month) for month in range(1, 13)], expected)


def test_days_in_month_month_zero_raises():
    with pytest.raises(ValueError):
        days_in_month(2024, 0)


def test_days_in_month_month_thirteen_raises():
    with pytest.raises(ValueError):
        days_in_month(2024, 13)


def test_add_months_zero():
    same(add_months(date(2024, 7, 19), 0), date(2024, 7, 19))


def test_add_months_into_next_year():
    same(add_months(date(2023, 12, 15), 1), date(2024, 1, 15))


def test_add_months_back_into_previous_year():
    same(add_months(date(2024, 1, 31), -1), date(2023, 12, 31))


def test_add_months_into_december():
    same(add_months(date(2023, 10, 31), 2), date(2023, 12, 31))
    same(add_months(date(2023, 11, 30), 1), date(2023, 12, 30))


def test_add_months_to_common_february():
    same(add_months(date(2023, 1, 31), 1), date(2023, 2, 28))


def test_add_months_leap_day_plus_a_year():
    same(add_months(date(2024, 2, 29), 12), date(2025, 2, 28))
    same(add_months(date(2020, 2, 29), 48), date(2024, 2, 29))


def test_add_months_large_negative():
    same(add_months(date(2024, 5, 31), -15), date(2023, 2, 28))


def test_business_days_between_same_day():
    same(business_days_between(date(2024, 1, 3), date(2024, 1, 3)), 0)


def test_business_days_between_single_weekday():
    same(business_days_between(date(2024, 1, 1), date(2024, 1, 2)), 1)


def test_business_days_between_friday_to_monday():
    same(business_days_between(date(2024, 1, 5), date(2024, 1, 8)), 1)


def test_business_days_between_weekend_only():
    same(business_days_between(date(2024, 1, 6), date(2024, 1, 7)), 0)
    same(business_days_between(date(2024, 1, 7), date(2024, 1, 8)), 0)


def test_business_days_between_reversed_is_negative():
    same(business_days_between(date(2024, 1, 8), date(2024, 1, 1)), -5)


def test_business_days_between_partial_week_across_weekend():
    same(business_days_between(date(2024, 1, 4), date(2024, 1, 16)), 8)


def test_business_days_between_starting_saturday():
    same(business_days_between(date(2024, 1, 6), date(2024, 1, 12)), 4)


def test_business_days_between_whole_leap_year():
    same(business_days_between(date(2024, 1, 1), date(2025, 1, 1)), 262)


def test_nth_weekday_month_starts_on_weekday():
    same(nth_weekday(2024, 6, 5, 1), date(2024, 6, 1))


def test_nth_weekday_first_falls_in_second_week():
    same(nth_weekday(2024, 6, 4, 1), date(2024, 6, 7))


def test_nth_weekday_fifth_occurrence():
    same(nth_weekday(2024, 6, 5, 5), date(2024, 6, 29))


def test_nth_weekday_missing_fifth_occurrence_raises():
    with pytest.raises(ValueError):
        nth_weekday(2024, 6, 4, 5)


def test_nth_weekday_last_day_of_month():
    same(nth_weekday(2024, 6, 6, -1), date(2024, 6, 30))


def test_nth_weekday_second_to_last():
    same(nth_weekday(2024, 6, 6, -2), date(2024, 6, 23))


def test_nth_weekday_last_monday_not_near_month_end():
    same(nth_weekday(2024, 6, 0, -1), date(2024, 6, 24))


def test_nth_weekday_first_monday_on_the_first():
    same(nth_weekday(2024, 7, 0, 1), date(2024, 7, 1))


def test_nth_weekday_last_weekday_after_month_end_weekday():
    same(nth_weekday(2024, 7, 4, -1), date(2024, 7, 26))


def test_nth_weekday_last_in_november():
    same(nth_weekday(2024, 11, 3, -1), date(2024, 11, 28))


def test_nth_weekday_last_in_december():
    same(nth_weekday(2024, 12, 1, -1), date(2024, 12, 31))


def test_nth_weekday_last_in_leap_february():
    same(nth_weekday(2024, 2, 3, -1), date(2024, 2, 29))


def test_nth_weekday_fifth_from_end():
    same(nth_weekday(2024, 6, 6, -5), date(2024, 6, 2))


def test_nth_weekday_sixth_from_end_raises():
    with pytest.raises(ValueError):
        nth_weekday(2024, 6, 6, -6)


def test_nth_weekday_zero_n_raises():
    with pytest.raises(ValueError):
        nth_weekday(2024, 6, 0, 0)


def test_nth_weekday_weekday_out_of_range_raises():
    with pytest.raises(ValueError):
        nth_weekday(2024, 6, 7, 1)
    with pytest.raises(ValueError):
        nth_weekday(2024, 6, -1, 1)


def test_age_on_birth_day():
    same(age_on(date(2010, 4, 2), date(2010, 4, 2)), 0)


def test_age_on_day_before_first_birthday():
    same(age_on(date(2020, 3, 10), date(2021, 3, 9)), 0)


def test_age_on_first_birthday():
    same(age_on(date(2020, 3, 10), date(2021, 3, 10)), 1)


def test_age_on_leap_day_birth():
    birth = date(2020, 2, 29)
    same(age_on(birth, date(2023, 2, 28)), 2)
    same(age_on(birth, date(2023, 3, 1)), 3)
    same(age_on(birth, date(2024, 2, 29)), 4)


def test_age_on_earlier_day_later_month():
    same(age_on(date(1980, 7, 20), date(2000, 8, 1)), 20)


def test_age_on_later_day_earlier_month():
    same(age_on(date(1980, 7, 5), date(2000, 6, 30)), 19)


def test_age_on_before_birth_raises():
    with pytest.raises(ValueError):
        age_on(date(2000, 1, 2), date(2000, 1, 1))
