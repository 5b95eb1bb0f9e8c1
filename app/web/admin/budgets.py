"""Budgets and price versions (admin only), written through ``app.accounting``.

Budgets: create, edit (limit, action, thresholds, on/off; scope and period identify a budget
and are fixed once made), disable and enable. Prices are versioned, never edited in place: a
change is a new version with its own ``valid_from``; a version not yet in effect can be retired.
Every change is an ``admin_change`` audit event with the values before and after.
"""

from __future__ import annotations

from datetime import UTC
from decimal import Decimal

from flask import abort, flash, redirect, render_template, request, url_for
from flask_wtf import FlaskForm
from sqlalchemy import select
from wtforms import BooleanField, DateTimeLocalField, DecimalField, SelectField, StringField
from wtforms.validators import (
    DataRequired,
    InputRequired,
    Length,
    Optional,
    Regexp,
    ValidationError,
)

from app import accounting
from app.audit.chain import EventType
from app.config import parse_thresholds
from app.db import row_id
from app.models import AdminRole, Budget, BudgetScope, ModelPrice
from app.outbox.rows import user_hash
from app.web.admin import audit_admin, bp, roles_required, services
from app.web.admin.limits import amount, in_calendar
from app.wecom.departments import DepartmentIdError, department_id

POSITIVE = amount(Decimal("0.000001"), "must be more than 0")
NOT_NEGATIVE = amount(Decimal(0), "must not be negative")


def _thresholds(form, field) -> None:
    try:
        parse_thresholds(field.data or "")
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


class BudgetForm(FlaskForm):
    scope = SelectField("Scope 范围", choices=list(BudgetScope.ALL))
    scope_value = StringField("Applies to 对象 (department id, WeCom user id, API key id)",
                              validators=[Optional(), Length(max=64)])
    period = SelectField("Period 周期", choices=list(accounting.PERIODS))
    limit = DecimalField("Limit 限额", places=6, validators=[InputRequired(), POSITIVE])
    action = SelectField("At 100 % 超限动作", choices=list(accounting.ACTIONS))
    thresholds = StringField("Alert thresholds % 预警阈值", validators=[DataRequired(), _thresholds])
    enabled = BooleanField("Enabled 启用", default=True)

    def validate_scope_value(self, field) -> None:
        if any(ord(c) < 32 or c == "\x7f" for c in field.data or ""):  # PostgreSQL refuses a NUL
            raise ValidationError("no control characters")
        if self.scope.data != BudgetScope.GLOBAL and not (field.data or "").strip():
            raise ValidationError(f"a {self.scope.data} budget needs the {self.scope.data} it applies to")
        if self.scope.data == BudgetScope.DEPARTMENT:
            try:
                department_id(field.data)
            except DepartmentIdError as exc:
                raise ValidationError(str(exc)) from None


class PriceForm(FlaskForm):
    model = StringField("Model 模型 ('*' = every model without its own price)",
                        validators=[DataRequired(), Length(max=64), Regexp(r"^[\w.:/*-]+$",
                                    message="letters, digits and . _ - : / * only")])
    input_per_m = DecimalField("Input per M tokens 输入", places=6, validators=[InputRequired(), NOT_NEGATIVE])
    cached_per_m = DecimalField("Cached input per M 缓存输入 (empty = input price)", places=6,
                                validators=[Optional(), NOT_NEGATIVE])
    output_per_m = DecimalField("Output per M tokens 输出", places=6, validators=[InputRequired(), NOT_NEGATIVE])
    currency = StringField("Currency 币种", validators=[DataRequired(), Regexp(r"^[A-Za-z]{3}$",
                           message="a 3-letter code such as CNY")])
    valid_from = DateTimeLocalField("Valid from 生效时间 (company time; empty = now)",
                                    format="%Y-%m-%dT%H:%M", validators=[Optional(), in_calendar])


def _budget_json(budget: Budget) -> dict:
    return {"budget_id": budget.id, "scope": budget.scope, "scope_value": budget.scope_value,
            "period": budget.period, "limit": str(budget.limit), "action": budget.action,
            "thresholds": budget.thresholds, "enabled": budget.enabled}


# -- budgets -----------------------------------------------------------------------------------------
@bp.get("/budgets")
@roles_required(AdminRole.ADMIN)
def budgets():
    with services().db.session() as session:
        rows = list(session.scalars(select(Budget).order_by(Budget.enabled.desc(), Budget.scope,
                                                            Budget.scope_value, Budget.period)))
    return render_template("admin/budgets.html", budgets=rows)


@bp.route("/budgets/new", methods=["GET", "POST"])
@roles_required(AdminRole.ADMIN)
def budget_new():
    svc = services()
    form = BudgetForm()
    if request.method == "GET":
        form.thresholds.data = svc.settings.budget_thresholds
    if form.validate_on_submit():
        value = (form.scope_value.data or "").strip()
        if form.scope.data == BudgetScope.USER:
            value = user_hash(svc.blind_index, value)
        try:
            if form.scope.data == BudgetScope.DEPARTMENT and value:  # as usage rows name it: "07" is 7
                value = str(department_id(value))  # DepartmentIdError is a ValueError
            with svc.db.transaction() as session:
                exists = session.scalar(select(Budget.id).where(
                    Budget.scope == form.scope.data, Budget.period == form.period.data,
                    Budget.scope_value == ("" if form.scope.data == BudgetScope.GLOBAL else value)))
                if exists is not None:
                    raise ValueError("this scope already has a budget for that period: edit it instead")
                budget = accounting.set_budget(session, form.scope.data, value, form.period.data,
                                               form.limit.data, form.action.data,
                                               ",".join(map(str, parse_thresholds(form.thresholds.data))),
                                               svc.settings.currency)
                budget.enabled = form.enabled.data
                audit_admin(session, EventType.ADMIN_CHANGE,
                            payload={"action": "budget_create", "after": _budget_json(budget)})
        except ValueError as exc:
            form.form_errors.append(str(exc))
        else:
            flash(f"Budget {budget.id} created. 预算已创建。")
            return redirect(url_for("admin.budgets"))
    status = 400 if form.errors or form.form_errors else 200
    return render_template("admin/budget_form.html", form=form, budget=None), status


@bp.route("/budgets/<int:budget_id>/edit", methods=["GET", "POST"])
@roles_required(AdminRole.ADMIN)
def budget_edit(budget_id: int):
    svc = services()
    with svc.db.session() as session:
        budget = session.get(Budget, budget_id)
    if budget is None:
        abort(404)
    form = BudgetForm(obj=budget if request.method == "GET" else None)
    # Scope and period identify the budget: shown, not editable.
    form.scope.data, form.period.data = budget.scope, budget.period
    form.scope_value.data = budget.scope_value or "-"
    if form.validate_on_submit():
        try:
            with svc.db.transaction() as session:
                before = _budget_json(session.get(Budget, budget_id))
                changed = accounting.set_budget(session, budget.scope, budget.scope_value,
                                                budget.period, form.limit.data, form.action.data,
                                                ",".join(map(str, parse_thresholds(form.thresholds.data))),
                                                budget.currency)
                changed.enabled = form.enabled.data
                session.flush()
                audit_admin(session, EventType.ADMIN_CHANGE,
                            payload={"action": "budget_edit", "before": before,
                                     "after": _budget_json(changed)})
        except ValueError as exc:
            form.form_errors.append(str(exc))
        else:
            flash(f"Budget {budget_id} saved. 已保存。")
            return redirect(url_for("admin.budgets"))
    status = 400 if form.errors or form.form_errors else 200
    return render_template("admin/budget_form.html", form=form, budget=budget), status


@bp.post("/budgets/<int:budget_id>/<any(disable, enable):switch>")
@roles_required(AdminRole.ADMIN)
def budget_switch(budget_id: int, switch: str):
    try:
        with services().db.transaction() as session:
            budget = accounting.set_budget_enabled(session, budget_id, switch == "enable")
            audit_admin(session, EventType.ADMIN_CHANGE,
                        payload={"action": f"budget_{switch}", "after": _budget_json(budget)})
    except LookupError:
        abort(404)
    flash(f"Budget {budget_id} {switch}d. 预算已{'启用' if switch == 'enable' else '停用'}。")
    return redirect(url_for("admin.budgets"))


# -- prices ------------------------------------------------------------------------------------------
@bp.get("/prices")
@roles_required(AdminRole.ADMIN)
def prices():
    from app.db import utcnow

    now = utcnow()
    with services().db.session() as session:
        rows = list(session.scalars(select(ModelPrice).order_by(ModelPrice.model,
                                                                ModelPrice.valid_from.desc())))
    current = {}
    for price in rows:  # newest first per model: the first one already valid is in effect
        if price.valid_from <= now and price.model not in current:
            current[price.model] = price.id
    return render_template("admin/prices.html", prices=rows, current=set(current.values()), now=now)


@bp.route("/prices/new", methods=["GET", "POST"])
@roles_required(AdminRole.ADMIN)
def price_new():
    svc = services()
    form = PriceForm()
    if request.method == "GET":
        form.currency.data = svc.settings.currency
        base_id = request.args.get("from", type=row_id)
        if base_id:  # "edit": a new version pre-filled from an existing one
            with svc.db.session() as session:
                base = session.get(ModelPrice, base_id)
            if base is not None:
                form.model.data, form.input_per_m.data = base.model, base.input_per_m
                form.cached_per_m.data, form.output_per_m.data = base.cached_input_per_m, base.output_per_m
                form.currency.data = base.currency
    if form.validate_on_submit():
        tz = svc.settings.timezone
        valid_from = (form.valid_from.data.replace(tzinfo=tz).astimezone(UTC)
                      if form.valid_from.data else None)
        cached = form.cached_per_m.data if form.cached_per_m.data is not None else form.input_per_m.data
        try:
            with svc.db.transaction() as session:
                if valid_from is not None and session.scalar(select(ModelPrice.id).where(
                        ModelPrice.model == form.model.data, ModelPrice.valid_from == valid_from)):
                    raise ValueError("this model has a version from that exact time already")
                price = accounting.set_price(session, form.model.data.strip(), form.input_per_m.data,
                                             cached, form.output_per_m.data,
                                             form.currency.data.upper(), valid_from)
                audit_admin(session, EventType.ADMIN_CHANGE, payload={
                    "action": "price_create", "price_id": price.id, "model": price.model,
                    "input_per_m": str(price.input_per_m), "cached_per_m": str(price.cached_input_per_m),
                    "output_per_m": str(price.output_per_m), "currency": price.currency,
                    "valid_from": price.valid_from.isoformat()})
        except ValueError as exc:
            form.form_errors.append(str(exc))
        else:
            flash(f"Price version for {price.model} added. 价格版本已添加。")
            return redirect(url_for("admin.prices"))
    status = 400 if form.errors or form.form_errors else 200
    return render_template("admin/price_form.html", form=form), status


@bp.post("/prices/<int:price_id>/retire")
@roles_required(AdminRole.ADMIN)
def price_retire(price_id: int):
    try:
        with services().db.transaction() as session:
            price = accounting.retire_price(session, price_id)
            audit_admin(session, EventType.ADMIN_CHANGE, payload={
                "action": "price_retire", "price_id": price_id, "model": price.model,
                "valid_from": price.valid_from.isoformat()})
    except LookupError:
        abort(404)
    except ValueError as exc:
        flash(str(exc), "error")
    else:
        flash(f"Future price version {price_id} retired. 已撤销。")
    return redirect(url_for("admin.prices"))
