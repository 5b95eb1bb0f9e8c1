"""Sign in with WeCom (``/admin/login/wecom`` and its callback) and the page where an admin maps
WeCom userids and departments to roles (``/admin/wecom-roles``). The checks live in app/sso."""

from __future__ import annotations

import redis
from flask import abort, flash, redirect, render_template, request, session, url_for
from flask_login import current_user
from flask_wtf import FlaskForm
from wtforms import SelectField, StringField
from wtforms.fields.choices import SelectChoice
from wtforms.validators import DataRequired, Length

from app.audit.chain import EventType
from app.models import AdminRole, WeComRoleMapping
from app.sso import roles
from app.sso.login_state import Pending
from app.sso.signin import SignInResult, WeComSignIn, account_name, end_sessions_for_mapping
from app.web.admin import audit_admin, bp, roles_required, services
from app.web.admin.auth import LoginForm, safe_next, start_session

PENDING_KEY = "wecom_login"  # the started sign-in's state and verifier in the session cookie
REFUSED = {  # outcome -> (HTTP status, what the person is told)
    "no_role": (403, "Your WeCom account has no admin role here: ask an admin to add it. "
                     "您的企业微信账号没有管理权限，请联系管理员。"),
    "ambiguous": (403, "Your departments grant different roles: ask an admin to set yours. "
                       "您所在部门对应的角色不一致，请联系管理员。"),
    "disabled": (403, "This account is turned off. 该账户已停用。"),
    "not_member": (403, "Only members of this company can sign in. 仅限本企业成员登录。"),
    "store_down": (503, "Sign-in is unavailable for a moment: try again. 登录暂不可用，请稍后再试。"),
    "wecom_down": (503, "WeCom did not answer: try again in a minute. 企业微信暂时无响应，请稍后再试。"),
}
EXPIRED = (400, "The sign-in expired or was already used: start it again. 登录已过期或已使用，请重新登录。")


@bp.app_context_processor
def _sign_in_options() -> dict:
    settings = services().settings
    return {"wecom_login_enabled": settings.wecom_login_enabled,
            "password_login_enabled": settings.admin_local_login}


def _sign_in(svc) -> WeComSignIn:
    if not svc.settings.wecom_login_enabled:
        abort(404)
    return WeComSignIn(svc.settings, svc.wecom, svc.db, svc.redis)


def _redirect_uri(settings) -> str:
    return settings.wecom_login_redirect_url or url_for("admin.wecom_callback", _external=True)


@bp.get("/login/wecom")
def wecom_login():
    """Send the browser to WeCom: the QR page, or OAuth inside the WeCom client (``wxwork``)."""
    svc = services()
    sign_in = _sign_in(svc)
    via = request.args.get("via") or ("oauth" if "wxwork" in request.headers.get("User-Agent", "").lower()
                                      else "qr")
    if via not in ("qr", "oauth"):
        abort(400)
    try:
        pending = sign_in.begin(via, safe_next())
    except redis.RedisError:
        return _refused("store_down")
    session[PENDING_KEY] = pending.to_session()
    return redirect(sign_in.authorize_url(via, pending.state, _redirect_uri(svc.settings)))


@bp.get("/login/wecom/callback")
def wecom_callback():
    svc = services()
    sign_in = _sign_in(svc)
    pending = Pending.from_session(session.pop(PENDING_KEY, None))
    try:
        result = sign_in.complete(pending, request.args.get("state", ""), request.args.get("code", ""))
    except redis.RedisError:  # the state store is down: nothing can be checked, nothing accepted
        result = SignInResult("store_down")
    with svc.db.transaction() as db_session:
        audit_admin(db_session, EventType.ADMIN_LOGIN, outcome=result.outcome[:16],
                    payload={"via": "wecom", "channel": result.channel,
                             "role": result.user.role if result.user else None,
                             "role_source": result.role_source},
                    actor=account_name(result.userid) if result.userid else "unknown")
    if result.outcome == "ok":
        start_session(svc, result.user)
        return redirect(result.next_path or url_for("admin.index"))
    return _refused(result.outcome)


def _refused(outcome: str):
    status, message = REFUSED.get(outcome, EXPIRED)
    flash(message, "error")
    return render_template("admin/login.html", form=LoginForm()), status


# -- role mappings (admin only) --------------------------------------------------------------------
class MappingForm(FlaskForm):
    kind = SelectField("Kind 类型", choices=[SelectChoice("user", "userid 成员"),
                                            SelectChoice("department", "department id 部门")])
    value = StringField("Userid or department id 成员账号或部门ID", validators=[DataRequired(), Length(max=64)])
    role = SelectField("Role 角色", choices=list(AdminRole.ALL))


@bp.route("/wecom-roles", methods=["GET", "POST"])
@roles_required(AdminRole.ADMIN)
def wecom_roles():
    svc = services()
    form = MappingForm()
    status = 200
    if form.validate_on_submit():
        try:
            with svc.db.transaction() as db_session:
                row = roles.set_mapping(db_session, form.kind.data, form.value.data, form.role.data,
                                        created_by=f"admin:{current_user.name}")
                end_sessions_for_mapping(db_session, row.kind, row.value)
                audit_admin(db_session, EventType.ADMIN_CHANGE, payload={
                    "action": "wecom_role_set", "kind": row.kind, "value": row.value, "role": row.role})
        except ValueError as exc:
            form.form_errors.append(str(exc))
        else:
            flash("Saved; sign-ins it affects start again. 已保存。")
            return redirect(url_for("admin.wecom_roles"))
    if form.errors or form.form_errors:
        status = 400
    with svc.db.session() as db_session:
        rows = roles.all_mappings(db_session)
    return render_template("admin/wecom_roles.html", form=form, mappings=rows), status


@bp.post("/wecom-roles/<int:mapping_id>/delete")
@roles_required(AdminRole.ADMIN)
def wecom_role_delete(mapping_id: int):
    with services().db.transaction() as db_session:
        row = db_session.get(WeComRoleMapping, mapping_id)
        if row is None:
            abort(404)
        kind, value = row.kind, row.value
        db_session.delete(row)
        end_sessions_for_mapping(db_session, kind, value)
        audit_admin(db_session, EventType.ADMIN_CHANGE, payload={
            "action": "wecom_role_remove", "kind": kind, "value": value})
    flash("Removed. 已删除。")
    return redirect(url_for("admin.wecom_roles"))

