"""The admin area under ``/admin``: login, dashboard, budgets and prices, audit, exports.

One blueprint (``admin``) with its ``templates/`` and ``static/`` beside it; the views live in
one module per page group (``auth``, ``dashboard``, ``budgets``, ``audit_views``, ``finance``,
``knowledge``).

Security: local accounts (``accounts.py``), Flask-Login sessions in a signed cookie (HttpOnly,
SameSite=Lax, Secure unless ``SESSION_COOKIE_SECURE=false``) that name a session kept
server-side (``sessions.py``: revoked at logout, an absolute lifetime), CSRF tokens (Flask-WTF) on every
form of the app except the WeCom callback blueprint, which WeCom signs itself. Roles:
``admin`` (budgets, prices, users, the knowledge base; may read the dashboard), ``finance``
(dashboard, cost export), ``auditor`` (audit search and export). Every admin action is an audit
event.
"""

from __future__ import annotations

from datetime import timedelta
from functools import wraps

from flask import Blueprint, abort, current_app, g, render_template, request, session
from flask.sessions import SecureCookieSessionInterface
from flask_login import LoginManager, current_user
from flask_wtf.csrf import CSRFProtect

from app.audit.chain import request_fingerprint
from app.models import AdminRole

bp = Blueprint("admin", __name__, url_prefix="/admin", template_folder="templates",
               static_folder="static", static_url_path="/static")
login_manager = LoginManager()
login_manager.login_view = "admin.login"
login_manager.login_message = "Please sign in. 请先登录。"
login_manager.session_protection = "basic"
csrf = CSRFProtect()


def init_app(app, services) -> None:
    settings = services.settings
    app.config.update(
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.session_cookie_secure,
        SESSION_COOKIE_NAME="wecom_admin",
        PERMANENT_SESSION_LIFETIME=timedelta(hours=settings.admin_session_hours),
        # The cookie's expiry stays where login set it; the server's session row decides anyway.
        SESSION_REFRESH_EACH_REQUEST=False,
        REMEMBER_COOKIE_HTTPONLY=True,
        REMEMBER_COOKIE_SECURE=settings.session_cookie_secure,
        WTF_CSRF_TIME_LIMIT=None,  # the token lives as long as the (time-limited) session
    )
    app.session_interface = AdminSessions()
    login_manager.init_app(app)
    from app.web.admin import knowledge

    app.before_request(knowledge.upload_limit)  # before CSRF's check, which reads the body
    csrf.init_app(app)
    from app.web import aibot_callback, api, callback

    csrf.exempt(callback.bp)  # WeCom signs its callbacks; it cannot send our token
    csrf.exempt(aibot_callback.bp)
    csrf.exempt(api.bp)  # API clients authenticate with a bearer key, not a session cookie

    from app.web.admin import (  # noqa: F401
        audit_views,
        auth,
        budgets,
        dashboard,
        finance,
        tools,
        users,
        wecom_login,
    )

    app.register_blueprint(bp)


class AdminSessions(SecureCookieSessionInterface):
    """Cookie sessions under ``/admin`` only, where people log in. The WeCom callbacks, ``/v1``
    and the probes carry none, yet Flask built a cookie signer for every request to look for one
    (about 80 µs of a callback); elsewhere the session is Flask's null one, never saved."""

    def open_session(self, app, request):
        if request.path == bp.url_prefix or request.path.startswith(bp.url_prefix + "/"):
            return super().open_session(app, request)
        return None


@login_manager.user_loader
def _load_user(user_id: str):
    """The account, only with a live server-side session for it (``sessions.user_for``)."""
    from app.web.admin import sessions

    return sessions.user_for(services().db, user_id, session.get(sessions.SESSION_KEY))


def services():
    return current_app.extensions["services"]


def roles_required(*roles: str):
    """Anonymous: to the login page; signed in with another role: the 403 page."""

    def decorator(view):
        @wraps(view)
        def wrapped(*args, **kwargs):
            if not current_user.is_authenticated:
                return login_manager.unauthorized()
            if current_user.role not in roles:
                abort(403)
            return view(*args, **kwargs)

        wrapped.roles = frozenset(roles)  # the access tests read it for every admin route
        return wrapped

    return decorator


COST_VIEWERS = (AdminRole.ADMIN, AdminRole.FINANCE)


def audit_admin(session, event_type: str, outcome: str = "ok", payload: dict | None = None,
                actor: str | None = None):
    """Append an admin action to the audit log inside the caller's transaction."""
    svc = services()
    return svc.audit.append(
        session, event_type, actor=f"admin:{actor or current_user.name}", outcome=outcome,
        payload=payload or {}, request_id=g.get("request_id"),
        fingerprint=request_fingerprint(svc.settings.secret_key.get_secret_value(),
                                        request.remote_addr, request.headers.get("User-Agent")))


@bp.app_template_global()
def short_hash(value: str | None, n: int = 12) -> str:
    return (value or "")[:n]


# Scripts only from our own static files (the chart data is an inert JSON block); inline
# style attributes are used for the budget bars. No framing: clickjacking on admin forms.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")


@bp.after_request
def _security_headers(response):
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    if not request.path.startswith("/admin/static/"):
        response.headers["Cache-Control"] = "no-store"  # pages carry costs and audit data
    return response


@bp.errorhandler(403)
def _forbidden(exc):
    return render_template("admin/403.html"), 403
