"""Settings written as small specs: budget thresholds ("50,80,100") and rates ("20/min")."""

from __future__ import annotations


def parse_thresholds(spec: str) -> tuple[int, ...]:
    """``"50,80,100"`` -> (50, 80, 100): percentages of a budget, each alerted once a period."""
    try:
        values = sorted({int(part) for part in spec.split(",") if part.strip()})
    except ValueError:
        raise ValueError("thresholds must be whole percentages like '50,80,100'") from None
    if not values or values[0] < 1 or values[-1] > 1000:
        raise ValueError("thresholds must be percentages between 1 and 1000")
    return tuple(values)


RATE_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600,
              "hour": 3600}


def parse_rate(spec: str) -> tuple[int, int]:
    """``"20/min"`` -> (20, 60): at most 20 per 60 s; ``"0"`` turns the limit off (0, 60)."""
    count, _, unit = spec.strip().lower().partition("/")
    try:
        limit = int(count)
    except ValueError:
        raise ValueError("must look like '20/min' (a whole number per s, min or hour)") from None
    window = RATE_UNITS.get(unit.strip() or "min")
    if window is None or limit < 0:
        raise ValueError("must look like '20/min' (a whole number per s, min or hour)")
    return limit, window
