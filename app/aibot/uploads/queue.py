"""Media messages waiting for the connection's holder, in Redis.

An entry (``aibot:ws:media`` hash: key -> chat, type, file name, time) and its bytes (a key of
their own, ``aibot:ws:media:data:<key>``, expiring with ``MAX_AGE_S``) are written together by
whoever has an image or a file for a member. The holder sends the entry and marks it sent
(``aibot:ws:media:sent:<key>`` for a day: the same key queued again is not sent twice); a holder
that dies before WeCom acknowledged the send leaves the entry, and the next one uploads it again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis

from app.wecom.aibot_ws import MAX_UPLOAD_CHUNKS, MEDIA_TYPES, UPLOAD_CHUNK_BYTES

MEDIA_KEY = "aibot:ws:media"
DATA_PREFIX = "aibot:ws:media:data:"
SENT_PREFIX = "aibot:ws:media:sent:"
SENT_TTL_S = 86400
MAX_AGE_S = 86400
# WeCom's limits for temporary media (the SDKs': images 10 MB, files 20 MB); at least 5 bytes.
MAX_BYTES = {"image": 10 * 1024 * 1024, "file": 20 * 1024 * 1024}
MIN_BYTES = 5


@dataclass(frozen=True)
class MediaPush:
    key: str
    chatid: str
    kind: str  # image | file
    filename: str
    since: float


@dataclass
class MediaPushes:
    client: redis.Redis

    def add(self, key: str, chatid: str, kind: str, filename: str, data: bytes) -> bool:
        """Queue ``data`` for ``chatid`` (a userid); False when this key was sent or is queued.
        ValueError for what WeCom would refuse anyway (type, size, name)."""
        if kind not in MEDIA_TYPES:
            raise ValueError(f"kind must be one of {MEDIA_TYPES}")
        limit = min(MAX_BYTES[kind], UPLOAD_CHUNK_BYTES * MAX_UPLOAD_CHUNKS)
        if not MIN_BYTES <= len(data) <= limit:
            raise ValueError(f"{kind}s are {MIN_BYTES} bytes to {limit} bytes, not {len(data)}")
        if not filename or len(filename) > 128 or any(c in filename for c in "/\\\r\n\0"):
            raise ValueError("a file name is 1-128 characters without / \\ or line breaks")
        if self.client.exists(SENT_PREFIX + key):
            return False
        entry = json.dumps({"chatid": chatid, "kind": kind, "filename": filename,
                            "since": time.time()}, ensure_ascii=False)
        pipe = self.client.pipeline()
        pipe.set(DATA_PREFIX + key, data, ex=MAX_AGE_S, nx=True)
        pipe.hsetnx(MEDIA_KEY, key, entry)
        return bool(pipe.execute()[1])

    def waiting(self, now: float | None = None) -> list[MediaPush]:
        """The media to send, oldest first; entries too old or unreadable are dropped."""
        now = time.time() if now is None else now
        out = []
        for raw_key, raw in self.client.hgetall(MEDIA_KEY).items():
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            try:
                entry = json.loads(raw)
                push = MediaPush(key, str(entry["chatid"]), str(entry["kind"]), str(entry["filename"]),
                                 float(entry["since"]))
            except (ValueError, KeyError, TypeError):
                self.drop(key)
                continue
            if now - push.since > MAX_AGE_S:
                self.drop(key)
                continue
            out.append(push)
        return sorted(out, key=lambda p: p.since)

    def data(self, key: str) -> bytes | None:
        return self.client.get(DATA_PREFIX + key)

    def sent(self, key: str) -> None:
        pipe = self.client.pipeline()
        pipe.set(SENT_PREFIX + key, 1, ex=SENT_TTL_S)
        pipe.hdel(MEDIA_KEY, key)
        pipe.delete(DATA_PREFIX + key)
        pipe.execute()

    def drop(self, key: str) -> None:
        pipe = self.client.pipeline()
        pipe.hdel(MEDIA_KEY, key)
        pipe.delete(DATA_PREFIX + key)
        pipe.execute()
