"""Bounds for what an admin types: amounts with a stored form, dates date arithmetic can reach.

A form value that passes its field's own parsing can still break what follows: ``NaN`` made a
``<`` raise, ``Infinity`` and ``1e30`` overflowed the money column, and a date at the calendar's
ends overflowed the day added to an inclusive range or the move to UTC. Each is refused here, as
a form error (400), before any of that runs.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from wtforms.validators import ValidationError

#: An admin amount (a budget, a price per million tokens) is at most this, in the currency unit.
MAX_AMOUNT = Decimal(10**9)
FIRST_DAY = date(2000, 1, 1)
LAST_DAY = date(2199, 12, 31)
DATE_RANGE_MESSAGE = f"dates must be between {FIRST_DAY} and {LAST_DAY}"


def amount(minimum: Decimal, message: str):
    """A finite amount from ``minimum`` (``message`` when below) to ``MAX_AMOUNT``."""
    def check(form, field) -> None:
        value = field.data
        if value is None:  # "not a valid decimal" already
            return
        if not value.is_finite():
            raise ValidationError("must be a number")
        if value < minimum:
            raise ValidationError(message)
        if value > MAX_AMOUNT:
            raise ValidationError(f"must be at most {MAX_AMOUNT:,}")

    return check


def in_calendar(form, field) -> None:
    """A date (or datetime) field between ``FIRST_DAY`` and ``LAST_DAY``."""
    if field.data is not None and not day_in_range(field.data):
        raise ValidationError(DATE_RANGE_MESSAGE)


def day_in_range(value: date | datetime) -> bool:
    day = value.date() if isinstance(value, datetime) else value
    return FIRST_DAY <= day <= LAST_DAY
