"""Budget periods in the company's time zone: a day, a week from Monday, a month from the 1st,
each beginning at local midnight (``COMPANY_TIMEZONE``) and stored as its UTC instant."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

PERIODS = ("day", "week", "month")


def period_start(period: str, at: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant the period containing ``at`` began: local midnight (Monday, the 1st)."""
    local = at.astimezone(tz)
    day = local.date()
    if period == "week":
        day -= timedelta(days=day.weekday())
    elif period == "month":
        day = day.replace(day=1)
    elif period != "day":
        raise ValueError(f"unknown period {period!r}")
    return datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(ZoneInfo("UTC"))


def period_end(period: str, start: datetime, tz: ZoneInfo) -> datetime:
    local = start.astimezone(tz).date()
    if period == "day":
        nxt = local + timedelta(days=1)
    elif period == "week":
        nxt = local + timedelta(days=7)
    else:
        nxt = (local.replace(day=28) + timedelta(days=4)).replace(day=1)
    return datetime(nxt.year, nxt.month, nxt.day, tzinfo=tz).astimezone(ZoneInfo("UTC"))


def local_day(at: datetime, tz: ZoneInfo) -> date:
    return at.astimezone(tz).date()
