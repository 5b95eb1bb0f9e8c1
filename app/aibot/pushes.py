"""Messages the AI bot writes first (``aibot_send_msg``), handed from any process to the one that
holds the long connection (``app.web.aibot_connection``).

The worker cannot write to the WebSocket: one replica of ``python -m app.web.aibot_connection``
holds it. So a push is a Redis hash entry (``aibot:ws:pushes``, key -> the chat and the text),
written by whoever has something to say (a budget alert for a department head), and the holder
sends each entry as an ``aibot_send_msg`` frame and drops it once WeCom acknowledged it,
leaving a "sent" mark for a day (``aibot:ws:pushed:<key>``): an entry added again with the same
key (a redelivered alert) is not sent twice. A holder that dies between the frame and WeCom's
ack leaves the entry to the next holder, which sends it again (at least once); an entry nobody
took within ``MAX_AGE_S`` (no holder running) is dropped unsent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis

PUSHES_KEY = "aibot:ws:pushes"
SENT_PREFIX = "aibot:ws:pushed:"
SENT_TTL_S = 86400
MAX_AGE_S = 86400


@dataclass(frozen=True)
class Push:
    key: str
    chatid: str
    content: str  # markdown
    since: float


@dataclass
class Pushes:
    client: redis.Redis
    key: str = PUSHES_KEY

    def add(self, key: str, chatid: str, content: str) -> bool:
        """Queue a markdown push to ``chatid`` (a userid: the member's single chat with the bot);
        False when one with this key was sent already or is queued."""
        if self.client.exists(SENT_PREFIX + key):
            return False
        entry = json.dumps({"chatid": chatid, "content": content, "since": time.time()},
                           ensure_ascii=False)
        return bool(self.client.hsetnx(self.key, key, entry))

    def waiting(self, now: float | None = None) -> list[Push]:
        """The pushes to send, oldest first; entries too old or unreadable are dropped."""
        now = time.time() if now is None else now
        out = []
        for raw_key, raw in self.client.hgetall(self.key).items():
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            try:
                entry = json.loads(raw)
                push = Push(key, str(entry["chatid"]), str(entry["content"]), float(entry["since"]))
            except (ValueError, KeyError, TypeError):
                self.client.hdel(self.key, key)
                continue
            if now - push.since > MAX_AGE_S:
                self.client.hdel(self.key, key)
                continue
            out.append(push)
        return sorted(out, key=lambda p: p.since)

    def sent(self, key: str) -> None:
        """WeCom acknowledged it: never again (for a day), and no longer waiting."""
        pipe = self.client.pipeline()
        pipe.set(SENT_PREFIX + key, 1, ex=SENT_TTL_S)
        pipe.hdel(self.key, key)
        pipe.execute()

    def drop(self, key: str) -> None:
        self.client.hdel(self.key, key)
