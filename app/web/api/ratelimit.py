"""Requests per minute per API key: a fixed one-minute window in Redis (``app.ratelimit``).

``INCR`` of ``ratelimit:api:<key id>:<minute>`` (expiring with the window) is atomic, so
concurrent requests in all gunicorn workers count exactly. A fixed window can let up to twice
the limit through across a minute boundary; for protecting a model server from one runaway
application that is enough, and it costs one round trip. If Redis is down the request passes
(logged): budgets still bound the spend, and the API should not go down with the cache.
"""

from __future__ import annotations

from app.ratelimit import Verdict, fixed_window

WINDOW_S = 60
__all__ = ["Verdict", "check"]


def check(redis, key_id: int, limit_per_min: int, now: float | None = None) -> Verdict:
    return fixed_window(redis, f"api:{key_id}", limit_per_min, WINDOW_S, now)
