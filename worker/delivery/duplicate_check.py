"""Which message/send requests carry WeCom's duplicate check.

Every answer asks WeCom to drop an identical request within ``WECOM_DUPLICATE_CHECK_S``, so a
send retried after a lost response is not shown twice. But WeCom compares requests, not the
messages they answer: an employee who asks the same thing twice within the window gets the same
words (a greedy model, a command's help text), and WeCom would drop the second answer silently.

So the first message to send a text to an employee owns that text for the window (a Redis key
made of keyed hashes, never the text or the user id): its attempts carry the check; another
message sending the same text does not. A lost response can then show that repeat twice (the
words the employee asked for again) rather than never. Redis unreachable: the check is kept,
as before (a repeat may be dropped, nothing is ever doubled).
"""

from __future__ import annotations

import logging

import redis

log = logging.getLogger(__name__)
PURPOSE = "wecom-sent"
# The key outlives WeCom's window a little: ending early would let a repeat claim the text while
# WeCom still holds the first send, and that repeat would be dropped.
MARGIN_S = 60


def key_for(services, user_hash: str, text: str) -> str:
    return "wecom:sent:" + services.blind_index(PURPOSE, f"{user_hash}\x00{text}")


def interval_for(services, user_hash: str, message_id: int, text: str) -> int | None:
    """The duplicate-check window for this message's send of ``text``, or None (no check)."""
    window = services.settings.wecom_duplicate_check_s
    key = key_for(services, user_hash, text)
    try:
        if services.redis.set(key, message_id, nx=True, ex=window + MARGIN_S):
            return window
        owner = services.redis.get(key)
    except redis.RedisError as exc:
        log.warning("duplicate-check owner unknown (%s): the check stays on", type(exc).__name__)
        return window
    if owner is None or int(owner) == message_id:  # expired just now, or this message's retry
        return window
    return None
