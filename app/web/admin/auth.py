"""Sign in and out; ``/admin/`` sends each role to its first page."""

from __future__ import annotations

import threading
from datetime import timedelta

from flask import flash, redirect, render_template, request, session, url_for
from flask_login import current_user, login_required, login_user, logout_user
from flask_wtf import FlaskForm
from wtforms import PasswordField, StringField
from wtforms.validators import DataRequired, Length

from app.audit.chain import EventType
from app.config import parse_rate
from app.models import AdminRole
from app.ratelimit import window_add, window_count
from app.web.admin import audit_admin, bp, services, sessions
from app.web.admin.accounts import LoginBusy, authenticate


class LoginForm(FlaskForm):
    name = StringField("User", validators=[DataRequired(), Length(max=64)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=1024)])


HOME = {AdminRole.ADMIN: "admin.dashboard", AdminRole.FINANCE: "admin.dashboard",
        AdminRole.AUDITOR: "admin.audit_search"}


@bp.get("/")
@login_required
def index():
    return redirect(url_for(HOME.get(current_user.role, "admin.login")))


#: One answer for every failed login: which names exist, and which are locked, is not told.
LOGIN_FAILED = ("Wrong user name or password, or the account is locked for a while. "
                "用户名或密码错误，或账户已临时锁定。")
LOGIN_THROTTLED = "Too many sign-in attempts: wait a minute. 尝试次数过多，请稍后再试。"
_check_slots: dict[int, threading.BoundedSemaphore] = {}


def _slots(limit: int) -> threading.BoundedSemaphore:
    """The process's password-check slots (argon2 takes 64 MiB each)."""
    return _check_slots.setdefault(limit, threading.BoundedSemaphore(limit))


def _login_buckets(settings):
    """(bucket, limit, window) of failed logins: per client address, and everyone together."""
    for bucket, spec in ((f"admin-login:ip:{request.remote_addr}", settings.admin_login_ip_limit),
                         ("admin-login:all", settings.admin_login_global_limit)):
        limit, window = parse_rate(spec)
        if limit:
            yield bucket, limit, window


def _throttled(svc) -> bool:
    """Whether this address, or everyone together, failed too often in the current window.
    Only failures count, so people who type their password right are never held up."""
    return any(window_count(svc.redis, bucket, window) >= limit
               for bucket, limit, window in _login_buckets(svc.settings))


def _count_failure(svc) -> None:
    for bucket, _limit, window in _login_buckets(svc.settings):
        window_add(svc.redis, bucket, window)


SIGN_IN_BY_WECOM_ONLY = "Password sign-in is turned off: sign in with WeCom. 密码登录已关闭，请使用企业微信登录。"


@bp.route("/login", methods=["GET", "POST"])
def login():
    form = LoginForm()
    if request.method == "POST" and not services().settings.admin_local_login:
        with services().db.transaction() as db_session:  # ADMIN_LOCAL_LOGIN=false
            audit_admin(db_session, EventType.ADMIN_LOGIN, outcome="password_off",
                        payload={"via": "password"}, actor="unknown")
        flash(SIGN_IN_BY_WECOM_ONLY, "error")
        return render_template("admin/login.html", form=None), 403
    if form.validate_on_submit():
        svc = services()
        name = form.name.data.strip()
        if _throttled(svc):
            flash(LOGIN_THROTTLED, "error")
            return render_template("admin/login.html", form=form), 429, {"Retry-After": "60"}
        settings = svc.settings
        try:
            result = authenticate(svc.db, name, form.password.data, settings.admin_lockout_attempts,
                                  timedelta(minutes=settings.admin_lockout_minutes),
                                  slots=_slots(settings.admin_login_concurrency))
        except LoginBusy:
            flash(LOGIN_THROTTLED, "error")
            return render_template("admin/login.html", form=form), 429, {"Retry-After": "5"}
        with svc.db.transaction() as db_session:
            # Unknown names are not echoed into the actor column (it could be a password typed
            # into the wrong field); the encrypted payload keeps it.
            actor = name if result.user is not None else "unknown"
            audit_admin(db_session, EventType.ADMIN_LOGIN,
                        outcome="ok" if result.outcome == "ok" else result.outcome[:16],
                        payload={"name": name}, actor=actor)
        if result.outcome == "ok":
            start_session(svc, result.user)
            return redirect(safe_next() or url_for("admin.index"))
        _count_failure(svc)
        flash(LOGIN_FAILED, "error")
        return render_template("admin/login.html", form=form), 401
    return render_template("admin/login.html", form=form)


@bp.post("/logout")
@login_required
def logout():
    with services().db.transaction() as db_session:
        audit_admin(db_session, EventType.ADMIN_LOGIN, outcome="logout")
    sessions.end(services().db, session.get(sessions.SESSION_KEY))  # a copied cookie dies too
    logout_user()
    session.clear()
    return redirect(url_for("admin.login"))


def start_session(svc, user) -> None:
    """Sign ``user`` in: a fresh cookie session naming a new server-side session."""
    session.clear()  # no state carried over from before the login
    session[sessions.SESSION_KEY] = sessions.start(
        svc.db, user.id, timedelta(hours=svc.settings.admin_session_hours))
    login_user(user)
    session.permanent = True


def safe_next() -> str | None:
    target = request.args.get("next", "")
    # Only paths inside the admin area: no scheme, no host, no "//evil".
    if target.startswith("/admin/") and not target.startswith("//") and "\\" not in target:
        return target
    return None
