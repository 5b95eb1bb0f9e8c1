"""Requests per minute per API key: a fixed one-minute window in Redis, shared by all processes.

``INCR`` of ``ratelimit:api:<key id>:<minute>`` (expiring with the window) is atomic, so
concurrent requests in all gunicorn workers count exactly. A fixed window can let up to twice
the limit through across a minute boundary; for protecting a model server from one runaway
application that is enough, and it costs one round trip. If Redis is down the request passes
(logged): budgets still bound the spend, and the API should not go down with the cache.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)
WINDOW_S = 60


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after_s: int = 0


def check(redis, key_id: int, limit_per_min: int, now: float | None = None) -> Verdict:
    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    name = f"ratelimit:api:{key_id}:{window}"
    try:
        pipe = redis.pipeline()
        pipe.incr(name)
        pipe.expire(name, WINDOW_S + 5)
        count, _ = pipe.execute()
    except Exception:  # noqa: BLE001 - fail open, see the module docstring
        log.warning("rate limit not checked: Redis unavailable")
        return Verdict(True)
    if count <= limit_per_min:
        return Verdict(True)
    return Verdict(False, max(1, int((window + 1) * WINDOW_S - now + 0.999)))
