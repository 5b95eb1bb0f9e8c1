"""A user's recent conversation, in Redis for 24 hours, encrypted like any other message field.

One Redis list per user (keyed by the user's blind index), newest last, trimmed to a bounded
length; each entry is AES-GCM sealed with associated data naming the list, so Redis never holds
message text in clear. An entry carries the outbox id it came from (``ref``).

An exchange is appended by one script that also keeps the last appended ``ref`` in a key of the
list's own Redis Cluster slot (``{conv:HASH}:ref``: a key without a hash tag is hashed whole, as
the tag ``{conv:HASH}`` is), so a retried task, or a script retried during a Redis failover,
never appends the same turn twice. The list keeps its name (``conv:HASH``): nothing is renamed
on upgrade, and the entries' associated data still names it.
"""

from __future__ import annotations

import json

import redis

from app.redis_client import companion_key
from app.security import FieldCipher, FieldDecryptError

# KEYS[1] the conversation, KEYS[2] the ref of its last appended exchange (one slot);
# ARGV: ref, the sealed question, the sealed answer, max entries, ttl.
_APPEND = """
if redis.call('GET', KEYS[2]) == ARGV[1] then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[2], ARGV[3])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[4]), -1)
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[5])
return 1
"""


class ConversationStore:
    def __init__(self, client: redis.Redis, cipher: FieldCipher, ttl_s: int, max_messages: int):
        self.redis = client
        self.cipher = cipher
        self.ttl_s = ttl_s
        self.max_messages = max_messages
        self._append = client.register_script(_APPEND)

    @staticmethod
    def _key(user_hash: str) -> str:
        return f"conv:{user_hash}"

    @staticmethod
    def _ref_key(user_hash: str) -> str:
        return companion_key(f"conv:{user_hash}", ":ref")

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

    def append_exchange(self, user_hash: str, ref: int, user_text: str, reply: str) -> bool:
        """Add one question and its answer, unless the exchange ``ref`` was the last appended
        (a retry appends right after it); False when it was."""
        key = self._key(user_hash)
        sealed = [self.cipher.encrypt(json.dumps({"role": role, "content": text, "ref": ref},
                                                 ensure_ascii=False), "redis", "conversation", key)
                  for role, text in (("user", user_text), ("assistant", reply))]
        return bool(self._append(keys=[key, self._ref_key(user_hash)],
                                 args=[str(ref), *sealed, self.max_messages, self.ttl_s]))

    def reset(self, user_hash: str) -> None:
        # one slot, so one DEL on a cluster too
        self.redis.delete(self._key(user_hash), self._ref_key(user_hash))
