"""WeCom department ids, checked wherever one comes in.

WeCom numbers departments with positive 32-bit integers (the root is 1). An id typed into an
admin form, a dashboard filter, a CLI option or read from an API answer is one of those or it is
refused here with a message a person can act on: a 30-digit number reached PostgreSQL's
``bigint`` column and a NUL byte its text parameters, and each answered a 500.
"""

from __future__ import annotations

import re

MAX_DEPARTMENT_ID = 2**32 - 1
_DIGITS = re.compile(r"[0-9]{1,10}")  # ASCII digits only: int() also takes "١٢", "1_000", " +7"
MESSAGE = f"a WeCom department id is a whole number from 1 to {MAX_DEPARTMENT_ID}"


class DepartmentIdError(ValueError):
    """Not a WeCom department id; the message says what one is."""


def department_id(value) -> int:
    """``value`` (an int, or a string of ASCII digits) as a department id, or ``DepartmentIdError``."""
    if isinstance(value, bool):
        raise DepartmentIdError(MESSAGE)
    if isinstance(value, str):
        text = value.strip()
        if not _DIGITS.fullmatch(text):
            raise DepartmentIdError(MESSAGE)
        value = int(text)
    if not isinstance(value, int) or not 1 <= value <= MAX_DEPARTMENT_ID:
        raise DepartmentIdError(MESSAGE)
    return value


def department_ids(spec: str | None) -> list[int]:
    """``"1, 2"`` -> [1, 2] (sorted, no repeats); empty or None -> []."""
    if spec is None or not spec.strip():
        return []
    parts = [part for part in spec.split(",") if part.strip()]
    if len(parts) > 1000:
        raise DepartmentIdError("at most 1000 department ids")
    return sorted({department_id(part) for part in parts})


def department_filter(value: str | None) -> str | None:
    """A report's department filter: None for "every department", else the id as the usage
    rows store it (``str(id)``)."""
    if value is None or not str(value).strip():
        return None
    return str(department_id(str(value)))


def known_ids(values) -> tuple[int, ...]:
    """The valid ids of a list WeCom answered (``user/get``'s ``department``), sorted; anything
    else is dropped, never passed on to a query."""
    found = set()
    for value in values or ():
        try:
            found.add(department_id(value))
        except DepartmentIdError:
            continue
    return tuple(sorted(found))
