"""A user's recent conversation, in Redis for 24 hours, encrypted like any other message field.

One Redis list per user (keyed by the user's blind index), newest last, trimmed to a bounded
length; each entry is AES-GCM sealed with associated data naming the list, so Redis never holds
message text in clear. An entry carries the outbox id it came from, so a retried task does not
append the same turn twice.
"""

from __future__ import annotations

import json

import redis

from app.security import FieldCipher, FieldDecryptError


class ConversationStore:
    def __init__(self, client: redis.Redis, cipher: FieldCipher, ttl_s: int, max_messages: int):
        self.redis = client
        self.cipher = cipher
        self.ttl_s = ttl_s
        self.max_messages = max_messages

    @staticmethod
    def _key(user_hash: str) -> str:
        return f"conv:{user_hash}"

    def history(self, user_hash: str) -> list[dict]:
        """The turns as ``[{"role", "content"}]``; unreadable entries (rotated away keys) are skipped."""
        key = self._key(user_hash)
        return self._turns(key, self.redis.lrange(key, 0, -1))

    def _turns(self, key: str, raws) -> list[dict]:
        turns = []
        for raw in raws:
            try:
                entry = json.loads(self.cipher.decrypt(raw.decode(), "redis", "conversation", key))
            except (FieldDecryptError, ValueError):
                continue
            turns.append({"role": entry["role"], "content": entry["content"], "ref": entry.get("ref")})
        return turns

    def append_exchange(self, user_hash: str, ref: int, user_text: str, reply: str) -> None:
        """Add one question and its answer, unless the turn ``ref`` is already there."""
        key = self._key(user_hash)
        # Only the last exchange can be this turn's (a retry appends right after it): two entries
        # read and decrypted, not the whole history again.
        if any(turn.get("ref") == ref for turn in self._turns(key, self.redis.lrange(key, -2, -1))):
            return
        sealed = [self.cipher.encrypt(json.dumps({"role": role, "content": text, "ref": ref},
                                                 ensure_ascii=False), "redis", "conversation", key)
                  for role, text in (("user", user_text), ("assistant", reply))]
        pipe = self.redis.pipeline()
        pipe.rpush(key, *sealed)
        pipe.ltrim(key, -self.max_messages, -1)
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def reset(self, user_hash: str) -> None:
        self.redis.delete(self._key(user_hash))
