"""Budgets and price versions (admin only)."""

from __future__ import annotations

from flask import render_template

from app.admin import bp, roles_required
from app.models import AdminRole


@bp.get("/budgets")
@roles_required(AdminRole.ADMIN)
def budgets():
    return render_template("admin/budgets.html")


@bp.get("/prices")
@roles_required(AdminRole.ADMIN)
def prices():
    return render_template("admin/prices.html")
