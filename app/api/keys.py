"""API keys of internal applications: create (shown once), authenticate, list, disable.

A key is ``sk-`` + 32 random bytes (base64url), so a plain hash would already be safe from
guessing; it is stored as HMAC-SHA256 keyed by ``BLIND_INDEX_KEY`` anyway (the blind index of
purpose ``api-key``), so a copy of the table alone cannot even confirm a leaked key. Lookup is by
that digest (a unique index), so authentication is one indexed query and no key comparison runs
in Python.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db import utcnow
from app.models import ApiKey
from app.security import BlindIndex

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


def key_hash(blind_index: BlindIndex, key: str) -> str:
    return blind_index("api-key", key)


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_key(session: Session, blind_index: BlindIndex, name: str,
               rate_limit_per_min: int = 60) -> tuple[ApiKey, str]:
    """Store a new key for ``name``; returns the row and the key (the only time it is seen)."""
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
    return row, key


def authenticate(db, blind_index: BlindIndex, key: str | None,
                 now: datetime | None = None) -> Caller | None:
    """The enabled key's caller, or None; notes ``last_used_at`` (at most once a minute)."""
    if not key or not key.startswith(KEY_PREFIX) or len(key) > 128:
        return None
    digest = key_hash(blind_index, key)
    now = now or utcnow()
    with db.session() as session:
        row = session.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
        if row is None or not row.enabled:
            return None
        caller = Caller(row.id, row.name, row.rate_limit_per_min)
        stale = row.last_used_at is None or now - row.last_used_at >= LAST_USED_EVERY
    if stale:
        with db.transaction() as session:
            session.execute(update(ApiKey).where(ApiKey.id == caller.id).values(last_used_at=now))
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
