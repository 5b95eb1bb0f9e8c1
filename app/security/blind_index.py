"""HMAC-SHA256 blind indexes: equality lookups on a field without storing it in clear.

A keyring (BLIND_INDEX_KEY, current key first), as DATA_KEYS is for the field cipher: writes use
the current key; a lookup asks for the digest under every key (``candidates``, one ``IN``), so
rows written under an older key are still found until ``keys rotate-index`` has moved them to the
current one (app/security/index_rotation.py), after which the older key can go.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence


class BlindIndex:
    def __init__(self, keys: bytes | str | Sequence[bytes | str]):
        if isinstance(keys, bytes | str):
            keys = [keys]
        self._keys = [k.encode() if isinstance(k, str) else k for k in keys]
        if not self._keys:
            raise ValueError("a blind index needs at least one key")

    def __call__(self, purpose: str, value: str) -> str:
        """A hex digest of ``value`` under the current key; ``purpose`` separates the domains
        (user ids vs dedup keys)."""
        return self.under(0, purpose, value)

    def under(self, index: int, purpose: str, value: str) -> str:
        message = purpose.encode() + b"\x00" + value.encode()
        return hmac.new(self._keys[index], message, hashlib.sha256).hexdigest()

    def candidates(self, purpose: str, value: str) -> list[str]:
        """The digest under every key, the current one first: what a lookup matches with IN."""
        return [self.under(i, purpose, value) for i in range(len(self._keys))]

    @property
    def key_count(self) -> int:
        return len(self._keys)
