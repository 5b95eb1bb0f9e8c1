"""The cost dashboard (admin and finance)."""

from __future__ import annotations

from flask import render_template

from app.admin import COST_VIEWERS, bp, roles_required


@bp.get("/dashboard")
@roles_required(*COST_VIEWERS)
def dashboard():
    return render_template("admin/dashboard.html")
