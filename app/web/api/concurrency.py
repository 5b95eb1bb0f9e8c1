"""Requests in flight per API key, across every web process (``API_MAX_CONCURRENT_PER_KEY``).

A per-minute rate does not bound what a key holds: five streams against a slow model stay well
under 60 a minute and keep five request threads for as long as the model takes. Each request of
a key takes a slot, a member of the Redis sorted set ``api:inflight:<key id>`` scored by when
its lease ends, and gives it back when its answer is done (a stream: when the response closes,
however it ends). Taking a slot first drops the expired ones, then counts, in one script, so
concurrent requests in all processes count exactly.

A process that dies keeps its slots until their lease runs out (``LEASE_S``); a live one renews
the slots it holds every ``RENEW_S`` from a thread of its own, so a stream may run as long as the
model takes. If Redis is down the request passes (logged), as the rate limit does: budgets still
bound the spend, and the API should not go down with the cache.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

import redis

log = logging.getLogger(__name__)
LEASE_S = 30.0
RENEW_S = 10.0

# KEYS[1] the set; ARGV: now, lease end, limit, token. {1, 0} taken; {0, seconds} full, with when
# the oldest lease ends at the latest.
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, tostring(first[2] - ARGV[1])}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(ARGV[2] - ARGV[1]) + 1)
return {1, '0'}
"""


class Slot:
    """One request's place among its key's in-flight requests; ``release`` is idempotent."""

    def __init__(self, holder: Holder | None, name: str, token: str):
        self._holder, self.name, self.token = holder, name, token

    def release(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            holder.release(self)


class Holder:
    """This process's slots, renewed while held."""

    def __init__(self, client: redis.Redis):
        self.redis = client
        self._take = client.register_script(_TAKE)
        self._held: dict[str, Slot] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def acquire(self, key_id: int, limit: int) -> Slot | float:
        """A slot, or the seconds until one may be free (for Retry-After)."""
        name, token, now = f"api:inflight:{key_id}", uuid.uuid4().hex, time.time()
        taken, wait = self._take(keys=[name], args=[now, now + LEASE_S, limit, token])
        if not int(taken):
            return max(float(wait), 0.0)
        slot = Slot(self, name, token)
        with self._lock:
            self._held[token] = slot
            if self._thread is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._renew, name="api-slots", daemon=True)
                self._thread.start()
        return slot

    def release(self, slot: Slot) -> None:
        with self._lock:
            self._held.pop(slot.token, None)
        try:
            self.redis.zrem(slot.name, slot.token)
        except redis.RedisError as exc:  # its lease ends it within LEASE_S
            log.warning("api: in-flight slot not released (%s)", type(exc).__name__)

    def _renew(self) -> None:
        while True:
            time.sleep(RENEW_S)
            with self._lock:
                held = list(self._held.values())
            if not held:
                continue
            until = time.time() + LEASE_S
            try:
                with self.redis.pipeline(transaction=False) as pipe:
                    for slot in held:
                        pipe.zadd(slot.name, {slot.token: until}, xx=True)
                        pipe.expire(slot.name, int(LEASE_S) + 1)
                    pipe.execute()
            except redis.RedisError as exc:
                log.warning("api: in-flight slots not renewed (%s)", type(exc).__name__)


def acquire(holder: Holder, key_id: int, limit: int) -> Slot | float:
    """A slot of ``key_id``'s ``limit`` (0: no limit), or the seconds to wait for one."""
    if limit <= 0:
        return Slot(None, "", "")
    try:
        return holder.acquire(key_id, limit)
    except redis.RedisError as exc:
        log.warning("api: in-flight limit not checked, Redis unavailable (%s)", type(exc).__name__)
        return Slot(None, "", "")
