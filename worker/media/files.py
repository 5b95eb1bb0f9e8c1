"""The files of a conversation, kept for the prompt, and ``/forget``, which drops them.

A file's extracted text (PDF, DOCX, TXT, MD) is sealed like the conversation, in a Redis list of
the conversation's TTL, at most ``MAX_FILES`` (the oldest dropped); the processor puts them
before the employee's next questions (``worker.media.prompt.with_files``).
"""

from __future__ import annotations

import json
import logging

import redis

from app.security import FieldDecryptError
from worker import commands

log = logging.getLogger(__name__)
MAX_FILES = 5  # per conversation; the oldest goes first


class FileContexts:
    """The files of one conversation: a Redis list of sealed ``{"name", "text", "ref"}``, the
    conversation's TTL, at most ``MAX_FILES`` (the oldest dropped)."""

    def __init__(self, client, cipher, ttl_s: int):
        self.redis, self.cipher, self.ttl_s = client, cipher, ttl_s

    @staticmethod
    def _key(conversation: str) -> str:
        return f"conv-files:{conversation}"

    def add(self, conversation: str, ref: int, name: str, text: str) -> None:
        key = self._key(conversation)
        if any(f.get("ref") == ref for f in self.files(conversation)):
            return  # a retried task
        sealed = self.cipher.encrypt(json.dumps({"name": name, "text": text, "ref": ref}, ensure_ascii=False),
                                     "redis", "conversation-file", key)
        pipe = self.redis.pipeline()
        pipe.rpush(key, sealed)
        pipe.ltrim(key, -MAX_FILES, -1)
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def files(self, conversation: str) -> list[dict]:
        key = self._key(conversation)
        found = []
        try:
            raws = self.redis.lrange(key, 0, -1)
        except redis.RedisError:
            log.warning("conversation files unavailable (Redis); answering without them")
            return []
        for raw in raws:
            try:
                found.append(json.loads(self.cipher.decrypt(raw.decode(), "redis", "conversation-file", key)))
            except (FieldDecryptError, ValueError):  # a key rotated away: that file is gone
                continue
        return found

    def drop(self, conversation: str) -> int:
        key = self._key(conversation)
        count = self.redis.llen(key)
        self.redis.delete(key)
        return int(count)


@commands.register("forget", "忘掉我发来的文件 / drop the files I sent")
def _forget(context: commands.CommandContext) -> str:
    dropped = context.files.drop(context.conversation_key or context.user_hash)
    if not dropped:
        return "你还没有发给我文件。You have not sent me any file."
    return f"好的，我已忘掉你发来的 {dropped} 个文件。Done: I've forgotten the {dropped} file(s) you sent."
