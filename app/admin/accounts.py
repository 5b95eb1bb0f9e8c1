"""Local admin accounts: argon2id password hashes, roles, lockout after failed logins.

``authenticate`` returns why a login failed; the login page tells a wrong name and a wrong
password apart from nobody (the audit event records which). A wrong name
still costs one argon2 verification, so timing does not tell names apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import utcnow
from app.models import AdminRole, AdminUser

hasher = PasswordHasher()
_DUMMY_HASH = hasher.hash("not a password anyone has")
MIN_PASSWORD_LENGTH = 12


@dataclass(frozen=True)
class LoginResult:
    user: AdminUser | None
    outcome: str  # ok | bad_password | unknown_user | locked | disabled


def validate_new_account(name: str, role: str, password: str) -> None:
    if not name or len(name) > 64 or not all(c.isalnum() or c in "._-@" for c in name):
        raise ValueError("names are 1-64 letters, digits or . _ - @")
    if role not in AdminRole.ALL:
        raise ValueError(f"role must be one of {', '.join(AdminRole.ALL)}")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise ValueError(f"passwords need at least {MIN_PASSWORD_LENGTH} characters")


def create_user(session: Session, name: str, role: str, password: str) -> AdminUser:
    validate_new_account(name, role, password)
    if session.scalar(select(AdminUser.id).where(AdminUser.name == name)) is not None:
        raise ValueError(f"user {name!r} exists already")
    user = AdminUser(name=name, role=role, password_hash=hasher.hash(password), enabled=True,
                     failed_attempts=0)
    session.add(user)
    session.flush()
    return user


def authenticate(session: Session, name: str, password: str, max_attempts: int = 5,
                 lockout: timedelta = timedelta(minutes=15),
                 now: datetime | None = None) -> LoginResult:
    """Check a login inside the caller's transaction, counting failures and locking."""
    now = now or utcnow()
    user = session.scalar(select(AdminUser).where(AdminUser.name == name))
    if user is None:
        _verify(_DUMMY_HASH, password)
        return LoginResult(None, "unknown_user")
    if user.locked_until is not None and user.locked_until > now:
        _verify(_DUMMY_HASH, password)
        return LoginResult(user, "locked")
    if not _verify(user.password_hash, password):
        user.failed_attempts = (user.failed_attempts or 0) + 1
        if user.failed_attempts >= max_attempts:
            user.locked_until, user.failed_attempts = now + lockout, 0
        session.flush()
        return LoginResult(user, "bad_password")
    if not user.enabled:
        return LoginResult(user, "disabled")
    user.failed_attempts, user.locked_until, user.last_login_at = 0, None, now
    if hasher.check_needs_rehash(user.password_hash):
        user.password_hash = hasher.hash(password)
    session.flush()
    return LoginResult(user, "ok")


def _verify(password_hash: str, password: str) -> bool:
    try:
        return hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False
