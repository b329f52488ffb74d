"""When cron schedules fire (awa/schedules.py), with explicit instants instead of a clock:
5 and 6 fields, the missed-fire policies, and both daylight-saving changes of
Europe/Berlin (2026-03-29 02:00 CET -> 03:00 CEST, 2026-10-25 03:00 CEST -> 02:00 CET)."""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo

import pytest

import awa
from awa.periodic.jobs import (
    MAX_CATCH_UP,
    CronTimes,
    check_cron,
    check_policy,
    check_timezone,
    due_fires,
    next_fire_of,
)

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def utc(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=dt.UTC)


def berlin(*parts: int, fold: int = 0) -> dt.datetime:
    """A Berlin wall-clock time as a UTC instant (a repeated local time never compares
    equal across zones, by Python's rules)."""
    return dt.datetime(*parts, tzinfo=BERLIN, fold=fold).astimezone(dt.UTC)


def local(fires: list[dt.datetime]) -> list[str]:
    return [fire.astimezone(BERLIN).isoformat() for fire in fires]


@pytest.mark.parametrize(
    "expression",
    ["", "* * * *", "61 * * * *", "* * * * * * * *", "every minute", "0 0 31 2 * x", 5],
)
def test_invalid_expressions_name_themselves(expression: object) -> None:
    with pytest.raises(awa.ValidationError, match="invalid cron expression"):
        check_cron(expression)


def test_valid_expressions() -> None:
    assert check_cron(" */5  * * * * ") == "*/5 * * * *"
    assert check_cron("*/10 * * * * *") == "*/10 * * * * *"
    assert check_cron("@DAILY") == "@daily"


def test_invalid_zone_and_policy() -> None:
    with pytest.raises(awa.ValidationError, match="invalid timezone: 'Mars/Olympus'"):
        CronTimes.of("* * * * *", "Mars/Olympus")
    with pytest.raises(awa.ValidationError, match="invalid cron missed fire policy 'sometimes'"):
        check_policy("sometimes")


@pytest.mark.parametrize("expression", ["0 0 30 2 *", "0 0 31 4 *", "0 0 0 31 2,4,6 *"])
def test_an_expression_that_never_fires(expression: str) -> None:
    """Valid fields, but no date matches them: every way of asking for a fire says so with
    a ValidationError naming the expression (croniter's own error never escapes)."""
    times = CronTimes.of(expression, "UTC")
    never = f"cron expression '{expression}' never fires: no time in the next 50 years"
    start, now = utc(2026, 1, 1, 0, 0), utc(2026, 6, 1, 0, 0)
    with pytest.raises(awa.ValidationError, match=re.escape(never)):
        times.first_fire(start)
    with pytest.raises(awa.ValidationError, match=re.escape(never)):
        next_fire_of(expression, "UTC", start)
    for policy in ("coalesce", "catch_up"):
        with pytest.raises(awa.ValidationError, match=re.escape(never)):
            due_fires(times, policy, start, now)


def test_rare_fires_are_found() -> None:
    assert next_fire_of("0 0 29 2 *", "UTC", utc(2026, 1, 1)) == utc(2028, 2, 29)
    # The fifth Monday of February: a 29 February that falls on a Monday.
    assert next_fire_of("0 0 * 2 1#5", "UTC", utc(2026, 1, 1)) == utc(2044, 2, 29)


@pytest.mark.parametrize(
    "name", ["posix/UTC", "right/UTC", "/etc/localtime", "../UTC", "UTC\x00", "utc", "Z" * 500]
)
def test_only_iana_names_are_zones(name: str) -> None:
    with pytest.raises(awa.ValidationError, match="is not a known IANA time zone"):
        check_timezone(name)
    assert check_timezone("Europe/Berlin").key == "Europe/Berlin"


def test_five_and_six_fields() -> None:
    minutes = CronTimes.of("*/15 * * * *", "UTC")
    assert list(minutes.fires(utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 1, 0))) == [
        utc(2026, 1, 1, 0, 15),
        utc(2026, 1, 1, 0, 30),
        utc(2026, 1, 1, 0, 45),
        utc(2026, 1, 1, 1, 0),
    ]
    seconds = CronTimes.of("*/20 * * * * *", "UTC")
    assert list(seconds.fires(utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 1))) == [
        utc(2026, 1, 1, 0, 0, 20),
        utc(2026, 1, 1, 0, 0, 40),
        utc(2026, 1, 1, 0, 1, 0),
    ]


def test_wall_clock_time_in_the_zone() -> None:
    daily = CronTimes.of("0 9 * * *", "Europe/Berlin")
    assert daily.next_fire(utc(2026, 1, 1, 12, 0)) == berlin(2026, 1, 2, 9, 0)
    assert daily.next_fire(utc(2026, 7, 1, 12, 0)) == berlin(2026, 7, 2, 9, 0)


def test_spring_forward_fires_a_missing_time_once_after_the_jump() -> None:
    """02:30 does not exist on 2026-03-29 in Berlin: the daily 02:30 job fires at 03:00."""
    daily = CronTimes.of("30 2 * * *", "Europe/Berlin")
    fires = list(daily.fires(utc(2026, 3, 27, 12, 0), utc(2026, 3, 31, 0, 0)))
    assert local(fires) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    # Several missing times (02:00, 02:20, 02:40) and 03:00 itself fire once, at 03:00.
    every20 = CronTimes.of("*/20 * * * *", "Europe/Berlin")
    fires = list(every20.fires(utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30)))
    assert local(fires) == [
        "2026-03-29T01:40:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-29T03:20:00+02:00",
    ]


def test_fall_back_fires_a_repeated_time_once() -> None:
    """02:30 happens twice on 2026-10-25 in Berlin: the daily 02:30 job fires once, at the
    first 02:30 (CEST)."""
    daily = CronTimes.of("30 2 * * *", "Europe/Berlin")
    fires = list(daily.fires(utc(2026, 10, 23, 12, 0), utc(2026, 10, 27, 0, 0)))
    assert local(fires) == [
        "2026-10-24T02:30:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    # Asked from inside the repeated hour (its second pass), the 02:30 already fired.
    assert daily.next_fire(berlin(2026, 10, 25, 2, 10, fold=1)) == berlin(2026, 10, 26, 2, 30)
    # A frequent schedule pauses while the hour repeats (documented; UTC runs steadily).
    every20 = CronTimes.of("*/20 * * * *", "Europe/Berlin")
    fires = list(every20.fires(utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 2, 30)))
    assert local(fires) == [
        "2026-10-25T02:20:00+02:00",
        "2026-10-25T02:40:00+02:00",
        "2026-10-25T03:00:00+01:00",
        "2026-10-25T03:20:00+01:00",
    ]


def test_latest_fire_across_the_repeated_hour() -> None:
    every20 = CronTimes.of("*/20 * * * *", "Europe/Berlin")
    second_pass = berlin(2026, 10, 25, 2, 15, fold=1)
    assert every20.latest_fire(utc(2026, 10, 24, 0, 0), second_pass) == berlin(2026, 10, 25, 2, 40)
    daily = CronTimes.of("30 2 * * *", "Europe/Berlin")
    assert daily.latest_fire(utc(2026, 3, 1, 0, 0), utc(2026, 3, 29, 12, 0)) == berlin(
        2026, 3, 29, 3, 0
    )
    assert daily.latest_fire(utc(2026, 3, 29, 2, 0), utc(2026, 3, 29, 12, 0)) is None


def test_missed_fire_policies() -> None:
    minutely = CronTimes.of("* * * * *", "UTC")
    after, now = utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 10, 30)
    assert due_fires(minutely, "coalesce", after, now) == [utc(2026, 1, 1, 0, 10)]
    assert due_fires(minutely, "catch_up", after, now) == [
        utc(2026, 1, 1, 0, minute) for minute in range(1, 11)
    ]
    assert due_fires(minutely, "catch_up", now, now) == []
    seconds = CronTimes.of("* * * * * *", "UTC")
    bounded = due_fires(seconds, "catch_up", after, utc(2026, 1, 2, 0, 0))
    assert len(bounded) == MAX_CATCH_UP
    assert bounded[0] == utc(2026, 1, 1, 0, 0, 1)
