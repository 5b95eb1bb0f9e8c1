"""How the worker answers an AI bot message: the model's text goes to the stream as it comes.

WeCom polls the stream about once a second and gives up 6 minutes after it started, so the
writer publishes the growing text (at most every ``throttle_s``, always the last piece) and says
stop once ``deadline_s`` has passed: the processor then finishes the stream with what it has and
a notice. Whoever finishes the stream first wins (see ``app.aibot.streams``); a writer that finds
it finished by someone else stops too.
"""

from __future__ import annotations

import logging
import time

import redis

from app.aibot.streams import StreamStore
from app.wecom.splitting import split_for_wecom

log = logging.getLogger(__name__)
#: WeCom shows at most this many bytes of a stream's content.
STREAM_CONTENT_LIMIT = 20480


def fit(text: str) -> str:
    """The text cut to what a stream can show, at a paragraph or sentence boundary, never inside
    a markdown span ("" while
    it is only blank: a model's first piece may be a bare newline)."""
    if not text:
        return text
    parts = split_for_wecom(text, STREAM_CONTENT_LIMIT, markup=True)
    return parts[0] if parts else ""


class StreamWriter:
    def __init__(self, store: StreamStore, stream_id: str, message_id: int, started: float,
                 deadline_s: float, throttle_s: float, clock=time.time):
        self.store, self.stream_id, self.message_id = store, stream_id, message_id
        self.started, self.deadline_s, self.throttle_s = started, deadline_s, throttle_s
        self.clock = clock
        self.closed_elsewhere = False
        self._last_write = 0.0

    @property
    def past_deadline(self) -> bool:
        return self.clock() - self.started >= self.deadline_s

    def finished_already(self) -> bool:
        """Did someone (the callback, at its deadline) finish the stream before we began?"""
        try:
            state = self.store.get(self.stream_id)
        except redis.RedisError:
            return False
        return state is not None and state.finished

    def __call__(self, text: str) -> bool:
        """Publish the answer so far; False means stop generating (deadline, or finished)."""
        if self.past_deadline:
            return False
        now = time.monotonic()
        if now - self._last_write < self.throttle_s:
            return True
        self._last_write = now
        return self._write(text, finish=False)

    def finish(self, text: str) -> bool:
        """End the stream with ``text``; False when it was already finished by someone else."""
        return self._write(text, finish=True)

    def _write(self, text: str, finish: bool) -> bool:
        try:
            written = self.store.write(self.stream_id, self.message_id, self.started, fit(text), finish)
        except redis.RedisError:
            # WeCom keeps polling; the callback answers from the outbox once the row is final.
            log.warning("stream write failed message_id=%s", self.message_id)
            return True
        if not written:
            self.closed_elsewhere = True
        return written
