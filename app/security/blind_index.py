"""HMAC-SHA256 blind indexes: equality lookups on a field without storing it in clear."""

from __future__ import annotations

import hashlib
import hmac


class BlindIndex:
    def __init__(self, key: bytes | str):
        self._key = key.encode() if isinstance(key, str) else key

    def __call__(self, purpose: str, value: str) -> str:
        """A hex digest of ``value``; ``purpose`` separates the domains (user ids vs dedup keys)."""
        message = purpose.encode() + b"\x00" + value.encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
