"""Local admin accounts: argon2id password hashes, roles, lockout after failed logins.

``authenticate`` returns why a login failed; the login page tells a wrong name, a wrong password
and a locked account apart from nobody (the audit event records which). A wrong name and a
locked account still cost one argon2 verification, so timing does not tell them apart either.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import and_, case, literal, null, or_, select, update
from sqlalchemy.orm import Session

from app.db import utcnow
from app.models import AdminRole, AdminUser

hasher = PasswordHasher()
_DUMMY_HASH = hasher.hash("not a password anyone has")
MIN_PASSWORD_LENGTH = 12
SLOT_WAIT_S = 10.0  # how long a login waits for a password-check slot before "try again"


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


class LoginBusy(RuntimeError):
    """Every password-check slot of this process stayed taken: try again shortly."""


def authenticate(db, name: str, password: str, max_attempts: int = 5,
                 lockout: timedelta = timedelta(minutes=15), *, slots: threading.Semaphore | None = None,
                 now: datetime | None = None) -> LoginResult:
    """Check a login, counting failures and locking, in two short transactions around the hash.

    An attempt is reserved before its password is checked: one ``UPDATE`` adds it to
    ``failed_attempts`` only while the account is unlocked and under ``max_attempts``, so
    however many guesses arrive together, at most ``max_attempts`` are checked against the hash
    per lockout (a read-then-write counted parallel guesses as one). argon2 runs outside any
    transaction (on SQLite the whole login held the one write lock) and, with ``slots``, a few
    at a time (each check takes 64 MiB). A right password clears the count.

    The state is consistent whatever happens between the two transactions: the reservation that
    takes the last attempt also locks the account (``locked_until``) while that attempt is
    checked, so a check that never finishes (the process killed) leaves a lock that expires,
    never a full count without one (which refused even the right password for ever); a check
    that could not run (``LoginBusy``: no slot) gives its attempt back. An expired lock starts
    a fresh count.
    """
    now = now or utcnow()
    until = now + lockout
    with db.transaction() as session:
        user_id = session.scalar(select(AdminUser.id).where(AdminUser.name == name))
        reserved = None if user_id is None else session.execute(
            _reserve(user_id, max_attempts, now, until)).first()
    if user_id is None or reserved is None:  # unknown or locked: the same work, no answer
        _check(slots, _DUMMY_HASH, password)
        return LoginResult(None, "unknown_user") if user_id is None else _result(db, user_id, "locked")
    attempt, password_hash = reserved
    try:
        right = _check(slots, password_hash, password)
    except BaseException:
        _give_back(db, user_id, attempt, max_attempts)
        raise
    with db.transaction() as session:
        user = session.get(AdminUser, user_id, populate_existing=True)
        if not right:
            if attempt >= max_attempts:
                user.locked_until, user.failed_attempts = until, 0
            session.flush()
            return LoginResult(user, "bad_password")
        user.failed_attempts = 0
        user.locked_until = None
        if not user.enabled:
            session.flush()
            return LoginResult(user, "disabled")
        user.last_login_at = now
        if hasher.check_needs_rehash(user.password_hash):
            user.password_hash = hasher.hash(password)
        session.flush()
        return LoginResult(user, "ok")


def _reserve(user_id: int, max_attempts: int, now: datetime, until: datetime):
    """The UPDATE that takes one attempt (RETURNING its number and the hash), or matches nothing
    while the account is locked or its attempts are taken.

    A lock that has expired, or a full count left without a lock (by a version that did not
    lock on the last attempt), starts a fresh count of 1. The last attempt locks the account
    until ``until`` while it is checked; the check's outcome then keeps or lifts the lock."""
    lock, count = AdminUser.locked_until, AdminUser.failed_attempts
    lock_expired = and_(lock.is_not(None), lock <= now)
    stuck = and_(lock.is_(None), count >= max_attempts)
    attempt = case((or_(lock_expired, stuck), 1), else_=count + 1)
    return (update(AdminUser)
            .where(AdminUser.id == user_id, or_(lock.is_(None), lock <= now),
                   or_(count < max_attempts, lock_expired, stuck))
            .values(failed_attempts=attempt,
                    locked_until=case((attempt >= max_attempts, literal(until, lock.type)),
                                      else_=null()))
            .returning(AdminUser.failed_attempts, AdminUser.password_hash)
            .execution_options(synchronize_session=False))


def _give_back(db, user_id: int, attempt: int, max_attempts: int) -> None:
    """The reserved attempt was never checked: uncount it (and lift the lock it took, when it
    was the last)."""
    values = {"failed_attempts": case((AdminUser.failed_attempts > 0, AdminUser.failed_attempts - 1),
                                      else_=0)}
    if attempt >= max_attempts:
        values["locked_until"] = None
    with db.transaction() as session:
        session.execute(update(AdminUser).where(AdminUser.id == user_id, AdminUser.failed_attempts == attempt)
                        .values(**values).execution_options(synchronize_session=False))


def _result(db, user_id: int, outcome: str) -> LoginResult:
    with db.session() as session:
        user = session.get(AdminUser, user_id)
        session.expunge(user)
    return LoginResult(user, outcome)


def _check(slots: threading.Semaphore | None, password_hash: str, password: str) -> bool:
    if slots is None:
        return _verify(password_hash, password)
    if not slots.acquire(timeout=SLOT_WAIT_S):
        raise LoginBusy("every password-check slot is taken")
    try:
        return _verify(password_hash, password)
    finally:
        slots.release()


def _verify(password_hash: str, password: str) -> bool:
    try:
        return hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False
