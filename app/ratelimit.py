"""Rate limits in Redis, shared by every process: one home for the API's and the chat's.

``fixed_window`` (``INCR`` of a per-window counter) is the API keys' limit: one round trip, and
it may let up to twice the limit through across a window boundary. ``sliding_window`` is the
WeCom users' limit: a sorted set of the last window's admitted events keyed by a member (the
message id), so a retried task never counts its message twice, the limit is exact at any
instant, and refused events do not count (a user who pauses gets through again).
Both fail open when Redis is down (logged): budgets still bound the spend, and the service
should not go down with the cache.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after_s: int = 0


def fixed_window(redis, bucket: str, limit: int, window_s: int = 60,
                 now: float | None = None) -> Verdict:
    """At most ``limit`` calls per aligned ``window_s`` for ``bucket``."""
    now = time.time() if now is None else now
    window = int(now // window_s)
    name = f"ratelimit:{bucket}:{window}"
    try:
        pipe = redis.pipeline()
        pipe.incr(name)
        pipe.expire(name, window_s + 5)
        count, _ = pipe.execute()
    except Exception:  # noqa: BLE001 - fail open, see the module docstring
        log.warning("rate limit not checked: Redis unavailable")
        return Verdict(True)
    if count <= limit:
        return Verdict(True)
    return Verdict(False, max(1, int((window + 1) * window_s - now + 0.999)))


def window_count(redis, bucket: str, window_s: int = 60, now: float | None = None) -> int:
    """How many ``window_add`` calls ``bucket`` had in the current aligned window (0 without
    Redis): a limit on failures, which are counted only once they happened."""
    now = time.time() if now is None else now
    try:
        return int(redis.get(f"ratelimit:{bucket}:{int(now // window_s)}") or 0)
    except Exception:  # noqa: BLE001 - fail open, see the module docstring
        log.warning("rate limit not checked: Redis unavailable")
        return 0


def window_add(redis, bucket: str, window_s: int = 60, now: float | None = None) -> None:
    now = time.time() if now is None else now
    name = f"ratelimit:{bucket}:{int(now // window_s)}"
    try:
        pipe = redis.pipeline()
        pipe.incr(name)
        pipe.expire(name, window_s + 5)
        pipe.execute()
    except Exception:  # noqa: BLE001 - fail open, see the module docstring
        log.warning("rate limit not counted: Redis unavailable")


# The sliding window in one script: one round trip instead of a five-command pipeline and a
# second trip for a refusal (the worker asks it for every message). Same steps, same order.
_SLIDING_WINDOW = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('EXPIRE', KEYS[1], ARGV[5])
if rank and rank < tonumber(ARGV[4]) then
  return {1}
end
redis.call('ZREM', KEYS[1], ARGV[1])
return {0, oldest[2] or ARGV[2]}
"""
_script = None  # redis-py's Script: EVALSHA, loaded again when the server lost it


def sliding_window(redis, bucket: str, member: str, limit: int, window_s: int = 60,
                   now: float | None = None) -> Verdict:
    """Is ``member`` among the first ``limit`` events of ``bucket`` in the last ``window_s``?

    The member keeps the time it was first seen (``ZADD NX``), so asking again for the same
    event gives the same answer until it slides out of the window. A refused event does not
    count: the window frees up for a user who stops.
    """
    now = time.time() if now is None else now
    name = f"ratelimit:{bucket}"
    try:
        global _script
        if _script is None:
            _script = redis.register_script(_SLIDING_WINDOW)
        result = _script(keys=[name], args=[member, repr(now), repr(now - window_s), limit,
                                           window_s + 5], client=redis)
    except Exception:  # noqa: BLE001 - fail open, see the module docstring
        log.warning("rate limit not checked: Redis unavailable")
        return Verdict(True)
    if result[0] == 1:
        return Verdict(True)
    first = float(result[1])
    return Verdict(False, max(1, int(first + window_s - now + 0.999)))


def once_per_window(redis, bucket: str, window_s: int) -> bool:
    """True the first time in ``window_s`` (e.g. one notice per window); True without Redis."""
    try:
        return bool(redis.set(f"ratelimit:{bucket}:once", "1", nx=True, ex=window_s))
    except Exception:  # noqa: BLE001 - fail open: a second notice is better than none
        return True
