"""The AI bot's streams in Redis: the worker writes the answer so far, the callback reads it.

WeCom polls a stream with refresh callbacks until a reply says ``finish``; the callback answers
each one from here, so the web process never waits on the model. One hash per stream id holds
the outbox id, when the stream started (epoch seconds: WeCom gives up 6 minutes later), the text
so far (AES-GCM sealed like every other message field, bound to the stream id) and ``finish``.

A finished stream never changes again: ``write`` is one compare-and-set script, so whichever of
the worker (answer complete, or its deadline reached) and the callback (the worker never came)
finishes first decides what the employee sees, and the other learns it lost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from app.security import FieldCipher, FieldDecryptError

EXPIRED_NOTICE = ("抱歉，这次回答超时了，请稍后重新提问。\n"
                  "Sorry, this answer took too long. Please ask again later.")
TRUNCATED_NOTICE = ("\n\n（回答时间已到上限，内容可能不完整。）\n"
                    "(The answer reached its time limit and may be incomplete.)")

# KEYS[1] the stream; ARGV: sealed text, finish "0"/"1", outbox id, started, ttl.
_WRITE = """
if redis.call('HGET', KEYS[1], 'finish') == '1' then return 0 end
redis.call('HSET', KEYS[1], 'text', ARGV[1], 'finish', ARGV[2])
redis.call('HSETNX', KEYS[1], 'msg', ARGV[3])
redis.call('HSETNX', KEYS[1], 'started', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


@dataclass(frozen=True)
class StreamState:
    message_id: int
    started: float
    text: str
    finished: bool

    def age_s(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.started


class StreamStore:
    def __init__(self, client: redis.Redis, cipher: FieldCipher, ttl_s: int):
        self.redis = client
        self.cipher = cipher
        self.ttl_s = ttl_s
        self._write = client.register_script(_WRITE)

    @staticmethod
    def key(stream_id: str) -> str:
        return f"aibot:stream:{stream_id}"

    def open(self, stream_id: str, message_id: int, started: float) -> None:
        """Start an empty stream (the callback, as it answers the message)."""
        self.write(stream_id, message_id, started, "", finish=False)

    def write(self, stream_id: str, message_id: int, started: float, text: str, finish: bool) -> bool:
        """Replace the text so far; False when the stream was already finished (by anyone)."""
        sealed = self.cipher.encrypt(text, "redis", "aibot_stream", stream_id)
        return bool(self._write(keys=[self.key(stream_id)],
                                args=[sealed, "1" if finish else "0", message_id, repr(started), self.ttl_s]))

    def get(self, stream_id: str) -> StreamState | None:
        data = self.redis.hgetall(self.key(stream_id))
        if not data or b"msg" not in data:
            return None
        try:
            text = self.cipher.decrypt(data.get(b"text", b"").decode(), "redis", "aibot_stream", stream_id)
        except (FieldDecryptError, ValueError):
            text = ""  # sealed under a key rotated away: show nothing rather than fail the poll
        return StreamState(int(data[b"msg"]), float(data.get(b"started", b"0")), text,
                           data.get(b"finish") == b"1")
