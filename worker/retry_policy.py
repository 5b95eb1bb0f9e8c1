"""How long a message waits before its next attempt after a transient failure.

Two schedules, both bounded by the row's attempt count (``TASK_MAX_RETRIES``; after the last
attempt the message is recorded as failed):

* WeCom's frequency limit (45009, or an HTTP 429): the limits are counted per minute and per
  hour (for message/send: 30 a minute and 1000 an hour per app and member, besides the daily
  total), and the answer names no wait, so retrying within seconds only spends calls that are
  refused again. The first retry waits ``WECOM_RATE_LIMIT_RETRY_S`` (60 s: the minute window
  has turned), each further one twice as long, at most ``MAX_WAIT_S``; plus up to 10 % jitter,
  so that messages refused together (an app-wide limit) do not all come back in the same
  second. A wait the server asked for (``Retry-After``) is honoured when longer.
* anything else (5xx, timeouts, -1 system busy, a model server away): 2, 4, 8 ... s, at most
  60 s.

``MAX_WAIT_S`` stays below the broker's visibility timeout (600 s, worker/celery_app.py): Redis
would hand a task whose countdown is longer to a worker again before it is due. With the
defaults (5 attempts) a rate-limited message waits 60 + 120 + 240 + 300 s, about 12 minutes,
within WeCom's duplicate-check window (``WECOM_DUPLICATE_CHECK_S``, 900 s) that keeps a retried
chunk from arriving twice.
"""

from __future__ import annotations

import random

MAX_WAIT_S = 300.0
BACKOFF_MAX_S = 60.0
JITTER = 0.10


def countdown(attempt: int, *, rate_limited: bool = False, retry_after: float | None = None,
              rate_limit_base_s: float = 60.0, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1 for the first attempt)."""
    attempt = max(1, attempt)
    if rate_limited:
        wait = min(rate_limit_base_s * 2 ** (attempt - 1), MAX_WAIT_S)
        wait *= 1 + JITTER * (rng or random).random()
    else:
        wait = min(2.0 ** attempt, BACKOFF_MAX_S)
    if retry_after:
        wait = max(wait, retry_after)
    return min(wait, MAX_WAIT_S)
