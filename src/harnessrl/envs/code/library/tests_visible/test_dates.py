from datetime import date

from dates import add_months, age_on, business_days_between, days_in_month, is_leap_year, nth_weekday


def test_is_leap_year_divisible_by_four():
    assert is_leap_year(2020) is True


def test_is_leap_year_common_year():
    assert is_leap_year(2023) is False


def test_days_in_month_january():
    assert days_in_month(2023, 1) == 31


def test_days_in_month_april():
    assert days_in_month(2023, 4) == 30


def test_add_months_simple():
    assert add_months(date(2023, 5, 10), 2) == date(2023, 7, 10)


def test_add_months_clamps_day():
    assert add_months(date(2023, 3, 31), 1) == date(2023, 4, 30)


def test_business_days_between_same_week():
    assert business_days_between(date(2024, 1, 1), date(2024, 1, 4)) == 3


def test_business_days_between_two_weeks():
    assert business_days_between(date(2024, 1, 1), date(2024, 1, 15)) == 10


def test_nth_weekday_first_monday():
    assert nth_weekday(2024, 9, 0, 1) == date(2024, 9, 2)


def test_nth_weekday_second_sunday():
    assert nth_weekday(2024, 5, 6, 2) == date(2024, 5, 12)


def test_age_on_after_birthday():
    assert age_on(date(2000, 1, 1), date(2020, 6, 1)) == 20


def test_age_on_before_birthday():
    assert age_on(date(2000, 12, 31), date(2020, 6, 1)) == 19
