"""The audit chain's MAC keys: the one in use and the earlier ones, newest first.

A key is derived from a ``SECRET_KEY`` (``chain_key``) and named by a public id (``key_id``, an
HMAC of a constant: it reveals nothing of the key). A key's *rank* is its place in the ring, 0
for the current key; ``verify`` accepts an earlier key only for rows sealed before the rotation
event that retired it, which it tells by rank: after a rotation to key K, a row must be sealed
with K or a newer key (``AuditLog.reseal_with_primary_key`` re-seals old rows under the newest).
"""

from __future__ import annotations

import hashlib
import hmac


def chain_key(secret: bytes | str) -> bytes:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, b"audit-chain-v1", hashlib.sha256).digest()


def key_id(key: bytes) -> str:
    return hmac.new(key, b"audit-key-id", hashlib.sha256).hexdigest()[:16]


class ChainKeys:
    def __init__(self, secret: bytes | str, previous_secrets=()):
        self.keys = [chain_key(secret), *(chain_key(old) for old in previous_secrets)]
        self.ids = [key_id(key) for key in self.keys]

    @property
    def current(self) -> bytes:
        return self.keys[0]

    @property
    def current_id(self) -> str:
        return self.ids[0]

    @property
    def oldest_rank(self) -> int:
        """The rank of a key that is not in the ring (dropped, so older than every key here)."""
        return len(self.keys)

    def rank(self, kid: str | None) -> int:
        return self.ids.index(kid) if kid in self.ids else self.oldest_rank

    def mac(self, data: bytes, rank: int = 0) -> str:
        return hmac.new(self.keys[rank], data, hashlib.sha256).hexdigest()

    def signer(self, data: bytes, mac: str | None) -> int | None:
        """The rank of the key whose MAC of ``data`` is ``mac``; None if none of them."""
        for rank in range(len(self.keys)):
            if mac is not None and hmac.compare_digest(self.mac(data, rank), mac):
                return rank
        return None
