"""The per-WeCom-user message rate limit (``WECOM_USER_RATE_LIMIT``, e.g. ``20/min``).

Checked by the worker before any model run, keyed by the user's blind index (never the raw
user id), on ``app.ratelimit``'s sliding window. Over the limit, the first message of the
window gets one polite notice and later ones get nothing, so a flood is not answered by a
flood; none of them reaches the model or costs anything.
"""

from __future__ import annotations

from app import ratelimit


class UserRateLimit:
    def __init__(self, redis, limit: int, window_s: int):
        self.redis, self.limit, self.window_s = redis, limit, window_s

    def describe(self) -> str:
        return f"{self.limit} per {self.window_s}s"

    def check(self, user_hash: str, message_id: int) -> bool | None:
        """None: within the limit (or the limit is off); True: over it, send the notice;
        False: over it and the notice for this window already went out."""
        if self.limit <= 0:
            return None
        verdict = ratelimit.sliding_window(self.redis, f"wecom-user:{user_hash}", str(message_id),
                                           self.limit, self.window_s)
        if verdict.allowed:
            return None
        return ratelimit.once_per_window(self.redis, f"wecom-user-notice:{user_hash}",
                                         verdict.retry_after_s)
