"""Admin sessions kept server-side: revoked at logout, an absolute lifetime.

Flask's cookie is only signed: by itself, a cookie copied before logout kept opening ``/admin``
until it expired, the expiry slid forward with every request, and anyone holding ``SECRET_KEY``
could sign a cookie for any account. So a login also creates an ``admin_sessions`` row: the
cookie carries a random token (``session["sid"]``), the row its SHA-256 (a database dump gives
no usable token), the account and ``expires_at``, fixed at login to ``ADMIN_SESSION_HOURS``
later and never extended. Every ``/admin`` request looks the row up with the account
(``user_for``): no row, an expired one, or a disabled account is anonymous (to the login page).
Logout deletes the row; disabling an account deletes all of its rows. Expired rows are deleted
at the next login.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import delete, select

from app.db import utcnow
from app.models import AdminSession, AdminUser

SESSION_KEY = "sid"  # the token's key in Flask's session


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def start(db, user_id: int, lifetime: timedelta) -> str:
    """A new session for the account; returns the token the cookie carries."""
    token = secrets.token_urlsafe(32)
    now = utcnow()
    with db.transaction() as session:
        session.execute(delete(AdminSession).where(AdminSession.expires_at <= now))
        session.add(AdminSession(id=_digest(token), user_id=user_id, created_at=now,
                                 expires_at=now + lifetime))
    return token


def user_for(db, user_id: str, token: str | None) -> AdminUser | None:
    """The enabled account whose unexpired session this token is, else None."""
    if not token or not isinstance(token, str) or not user_id.isdigit():
        return None
    with db.session() as session:
        return session.scalar(
            select(AdminUser).join(AdminSession, AdminSession.user_id == AdminUser.id)
            .where(AdminSession.id == _digest(token), AdminUser.id == int(user_id),
                   AdminSession.expires_at > utcnow(), AdminUser.enabled.is_(True)))


def end(db, token: str | None) -> None:
    """Revoke one session (logout); safe to call twice."""
    if token and isinstance(token, str):
        with db.transaction() as session:
            session.execute(delete(AdminSession).where(AdminSession.id == _digest(token)))


def end_all(session, user_id: int) -> None:
    """Revoke every session of an account, in the caller's transaction."""
    session.execute(delete(AdminSession).where(AdminSession.user_id == user_id))
