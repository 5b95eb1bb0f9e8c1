"""API keys of internal applications: create (shown once), authenticate, list, disable.

A key is ``sk-`` + 32 random bytes (base64url), so a plain hash would already be safe from
guessing; it is stored as HMAC-SHA256 keyed by ``BLIND_INDEX_KEY`` anyway (the blind index of
purpose ``api-key`` of the key's SHA-256), so a copy of the table alone cannot even confirm a
leaked key. Lookup is by that digest (a unique index), so authentication is one indexed query
and no key comparison runs in Python.

BLIND_INDEX_KEY is a keyring: a lookup matches the digest under every key, and a key found
under an older one is moved to the current one on that use. ``key_seal`` keeps the SHA-256
sealed with DATA_KEYS, so ``keys rotate-index`` re-computes every digest without the keys
themselves; a key made before migration 0009 (digest of the key itself, no seal) gets its seal
on its next use.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db import utcnow
from app.models import ApiKey
from app.security import BlindIndex, FieldCipher

KEY_PREFIX = "sk-"
DISPLAY_CHARS = 10  # "sk-" and 7 random characters: enough to tell keys apart in a list
LAST_USED_EVERY = timedelta(minutes=1)  # write last_used_at at most this often per key


@dataclass(frozen=True)
class Caller:
    """The authenticated application, detached from any session."""

    id: int
    name: str
    rate_limit_per_min: int

    @property
    def actor(self) -> str:
        return f"api_key:{self.name}"


def key_digest_input(key: str) -> str:
    """What the digest and the seal are of: the key's SHA-256 (never the key itself)."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_hash(blind_index: BlindIndex, key: str) -> str:
    """The digest stored for ``key`` now: under the current key."""
    return blind_index("api-key", key_digest_input(key))


def key_hashes(blind_index: BlindIndex, key: str) -> list[str]:
    """Every digest ``key`` may be stored as, the current one first: under each key of the ring,
    of its SHA-256, then (keys made before migration 0009) of the key itself."""
    return [*blind_index.candidates("api-key", key_digest_input(key)),
            *blind_index.candidates("api-key", key)]


def seal(cipher: FieldCipher, row_id: int, key: str) -> str:
    return cipher.encrypt(key_digest_input(key), ApiKey.__tablename__, "key_seal", row_id)


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_key(session: Session, blind_index: BlindIndex, name: str,
               rate_limit_per_min: int = 60, cipher: FieldCipher | None = None) -> tuple[ApiKey, str]:
    """Store a new key for ``name``; returns the row and the key (the only time it is seen).
    With ``cipher`` (the CLI passes it) its seal too, which ``keys rotate-index`` needs."""
    name = name.strip()
    if not name or len(name) > 64:
        raise ValueError("the name must be 1 to 64 characters")
    if rate_limit_per_min < 1:
        raise ValueError("the rate limit must be at least 1 request per minute")
    if session.scalar(select(ApiKey.id).where(ApiKey.name == name)) is not None:
        raise ValueError(f"an API key named {name!r} exists already")
    key = new_key()
    row = ApiKey(name=name, prefix=key[:DISPLAY_CHARS], key_hash=key_hash(blind_index, key),
                 enabled=True, rate_limit_per_min=rate_limit_per_min, created_at=utcnow())
    session.add(row)
    session.flush()
    if cipher is not None:
        row.key_seal = seal(cipher, row.id, key)
        session.flush()
    return row, key


def authenticate(db, blind_index: BlindIndex, key: str | None, now: datetime | None = None,
                 cipher: FieldCipher | None = None) -> Caller | None:
    """The enabled key's caller, or None; notes ``last_used_at`` (at most once a minute), and
    moves a digest found under an older key (or without its seal) to the current one."""
    if not key or not key.startswith(KEY_PREFIX) or len(key) > 128:
        return None
    digests = key_hashes(blind_index, key)
    now = now or utcnow()
    with db.session() as session:
        row = session.scalar(select(ApiKey).where(ApiKey.key_hash.in_(digests)))
        if row is None or not row.enabled:
            return None
        caller = Caller(row.id, row.name, row.rate_limit_per_min)
        stale = row.last_used_at is None or now - row.last_used_at >= LAST_USED_EVERY
        values = {"last_used_at": now} if stale else {}
        if row.key_hash != digests[0]:
            values["key_hash"] = digests[0]
        if row.key_seal is None and cipher is not None:
            values["key_seal"] = seal(cipher, row.id, key)
        found = row.key_hash
    if values:
        with db.transaction() as session:  # compare-and-set: a concurrent use did it already
            session.execute(update(ApiKey).where(ApiKey.id == caller.id, ApiKey.key_hash == found)
                            .values(values))
    return caller


def disable_key(session: Session, name: str) -> ApiKey:
    row = session.scalar(select(ApiKey).where(ApiKey.name == name))
    if row is None:
        raise ValueError(f"no API key named {name!r}")
    row.enabled = False
    session.flush()
    return row


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.id)))
