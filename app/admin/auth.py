"""Sign in and out; ``/admin/`` sends each role to its first page."""

from __future__ import annotations

from datetime import timedelta

from flask import flash, redirect, render_template, request, session, url_for
from flask_login import current_user, login_required, login_user, logout_user
from flask_wtf import FlaskForm
from wtforms import PasswordField, StringField
from wtforms.validators import DataRequired, Length

from app.admin import audit_admin, bp, services
from app.admin.accounts import authenticate
from app.audit import EventType
from app.models import AdminRole


class LoginForm(FlaskForm):
    name = StringField("User", validators=[DataRequired(), Length(max=64)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=1024)])


HOME = {AdminRole.ADMIN: "admin.dashboard", AdminRole.FINANCE: "admin.dashboard",
        AdminRole.AUDITOR: "admin.audit_search"}


@bp.get("/")
@login_required
def index():
    return redirect(url_for(HOME.get(current_user.role, "admin.login")))


@bp.route("/login", methods=["GET", "POST"])
def login():
    form = LoginForm()
    if form.validate_on_submit():
        svc = services()
        name = form.name.data.strip()
        with svc.db.transaction() as db_session:
            result = authenticate(db_session, name, form.password.data,
                                  svc.settings.admin_lockout_attempts,
                                  timedelta(minutes=svc.settings.admin_lockout_minutes))
            # Unknown names are not echoed into the actor column (it could be a password typed
            # into the wrong field); the encrypted payload keeps it.
            actor = name if result.user is not None else "unknown"
            audit_admin(db_session, EventType.ADMIN_LOGIN,
                        outcome="ok" if result.outcome == "ok" else result.outcome[:16],
                        payload={"name": name}, actor=actor)
        if result.outcome == "ok":
            session.clear()  # no state carried over from before the login
            login_user(result.user)
            session.permanent = True
            return redirect(_safe_next() or url_for("admin.index"))
        if result.outcome == "locked":
            flash("Too many failed attempts: the account is locked for a while. 账户已临时锁定。",
                  "error")
        else:
            flash("Wrong user name or password. 用户名或密码错误。", "error")
        return render_template("admin/login.html", form=form), 401
    return render_template("admin/login.html", form=form)


@bp.post("/logout")
@login_required
def logout():
    with services().db.transaction() as db_session:
        audit_admin(db_session, EventType.ADMIN_LOGIN, outcome="logout")
    logout_user()
    session.clear()
    return redirect(url_for("admin.login"))


def _safe_next() -> str | None:
    target = request.args.get("next", "")
    # Only paths inside the admin area: no scheme, no host, no "//evil".
    if target.startswith("/admin/") and not target.startswith("//") and "\\" not in target:
        return target
    return None
