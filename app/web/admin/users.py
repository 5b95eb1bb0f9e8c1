"""Admin accounts page (admin only): list, create, disable/enable, clear a lockout."""

from __future__ import annotations

from flask import abort, flash, redirect, render_template, url_for
from flask_login import current_user
from flask_wtf import FlaskForm
from sqlalchemy import select
from wtforms import PasswordField, SelectField, StringField
from wtforms.validators import DataRequired, EqualTo, Length

from app.audit.chain import EventType
from app.models import AdminRole, AdminUser
from app.web.admin import audit_admin, bp, roles_required, services, sessions
from app.web.admin.accounts import MIN_PASSWORD_LENGTH, create_user


class UserForm(FlaskForm):
    name = StringField("User name 用户名", validators=[DataRequired(), Length(max=64)])
    role = SelectField("Role 角色", choices=list(AdminRole.ALL))
    password = PasswordField("Password 密码", validators=[
        DataRequired(), Length(min=MIN_PASSWORD_LENGTH, max=1024,
                               message=f"at least {MIN_PASSWORD_LENGTH} characters")])
    confirm = PasswordField("Repeat password 确认密码",
                            validators=[EqualTo("password", message="the passwords differ")])


@bp.route("/users", methods=["GET", "POST"])
@roles_required(AdminRole.ADMIN)
def users():
    svc = services()
    form = UserForm()
    status = 200
    if form.validate_on_submit():
        try:
            with svc.db.transaction() as session:
                user = create_user(session, form.name.data.strip(), form.role.data, form.password.data)
                audit_admin(session, EventType.ADMIN_CHANGE, payload={
                    "action": "user_create", "user": user.name, "role": user.role})
        except ValueError as exc:
            form.form_errors.append(str(exc))
        else:
            flash(f"User {user.name} ({user.role}) created. 账户已创建。")
            return redirect(url_for("admin.users"))
    if form.errors or form.form_errors:
        status = 400
    with svc.db.session() as session:
        rows = list(session.scalars(select(AdminUser).order_by(AdminUser.name)))
    return render_template("admin/users.html", form=form, users=rows), status


@bp.post("/users/<int:user_id>/<any(disable, enable, unlock):change>")
@roles_required(AdminRole.ADMIN)
def user_change(user_id: int, change: str):
    if change == "disable" and user_id == current_user.id:
        flash("You cannot disable your own account.", "error")
        return redirect(url_for("admin.users"))
    with services().db.transaction() as session:
        user = session.get(AdminUser, user_id)
        if user is None:
            abort(404)
        if change == "unlock":
            user.failed_attempts, user.locked_until = 0, None
        else:
            user.enabled = change == "enable"
            if not user.enabled:
                sessions.end_all(session, user.id)  # enabling again does not revive them
        audit_admin(session, EventType.ADMIN_CHANGE, payload={"action": f"user_{change}",
                                                              "user": user.name})
        name = user.name
    flash(f"User {name}: {change} done.")
    return redirect(url_for("admin.users"))
