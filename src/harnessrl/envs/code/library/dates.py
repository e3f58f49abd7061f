"""Date utilities built on the standard ``datetime`` module."""

from datetime import date, timedelta


def is_leap_year(year: int) -> bool:
    """Tell whether ``year`` is a leap year in the proleptic Gregorian calendar.

    >>> is_leap_year(2024)
    True
    >>> is_leap_year(1900)
    False
    """
    if year % 400 == 0:
        return True
    if year % 100 == 0:
        return False
    return year % 4 == 0


def days_in_month(year: int, month: int) -> int:
    """Return the number of days in ``month`` (1-12) of ``year``.

    >>> days_in_month(2023, 2)
    28
    >>> days_in_month(2024, 2)
    29
    """
    if month < 1 or month > 12:
        raise ValueError(f"month must be in 1..12, got {month}")
    if month == 2:
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return 29 if leap else 28
    if month in (4, 6, 9, 11):
        return 30
    return 31


def add_months(start: date, months: int) -> date:
    """Shift a date by a number of months, clamping the day to the end of the target month.

    >>> add_months(date(2024, 1, 31), 1)
    datetime.date(2024, 2, 29)
    >>> add_months(date(2024, 3, 15), -3)
    datetime.date(2023, 12, 15)
    """
    year, month_index = divmod(start.year * 12 + start.month - 1 + months, 12)
    month = month_index + 1
    if month == 12:
        next_month = date(year + 1, 1, 1)
    else:
        next_month = date(year, month + 1, 1)
    last_day = (next_month - timedelta(days=1)).day
    return date(year, month, min(start.day, last_day))


def business_days_between(start: date, end: date) -> int:
    """Count the weekdays (Monday to Friday) from ``start`` inclusive to ``end`` exclusive.

    The count is negative when ``end`` is before ``start``.

    >>> business_days_between(date(2024, 1, 1), date(2024, 1, 8))
    5
    >>> business_days_between(date(2024, 1, 6), date(2024, 1, 8))
    0
    """
    if end < start:
        return -business_days_between(end, start)
    full_weeks, extra_days = divmod((end - start).days, 7)
    count = full_weeks * 5
    first_weekday = start.weekday()
    for offset in range(extra_days):
        if (first_weekday + offset) % 7 < 5:
            count += 1
    return count


def nth_weekday(year: int, month: int, weekday: int, n: int) -> date:
    """Return the ``n``-th ``weekday`` (0 is Monday) of a month; a negative ``n`` counts from the end.

    >>> nth_weekday(2024, 11, 3, 4)
    datetime.date(2024, 11, 28)
    >>> nth_weekday(2024, 5, 0, -1)
    datetime.date(2024, 5, 27)
    """
    if n == 0 or not 0 <= weekday <= 6:
        raise ValueError("n must be non-zero and weekday in 0..6")
    if n > 0:
        first = date(year, month, 1)
        result = first + timedelta(days=(weekday - first.weekday()) % 7 + 7 * (n - 1))
    else:
        last = date(year + month // 12, month % 12 + 1, 1) - timedelta(days=1)
        result = last - timedelta(days=(last.weekday() - weekday) % 7 + 7 * (-n - 1))
    if result.month != month:
        raise ValueError(f"{year}-{month:02d} has no such occurrence of weekday {weekday}")
    return result


def age_on(birth: date, on: date) -> int:
    """Return the age in completed years, on date ``on``, of someone born on ``birth``.

    Someone born on 29 February has their birthday on 1 March in common years.

    >>> age_on(date(1990, 6, 15), date(2024, 6, 14))
    33
    >>> age_on(date(1990, 6, 15), date(2024, 6, 15))
    34
    """
    if on < birth:
        raise ValueError("date is before birth")
    years = on.year - birth.year
    if (on.month, on.day) < (birth.month, birth.day):
        years -= 1
    return years
