"""Audit search and compliance export (auditor only)."""

from __future__ import annotations

from flask import render_template

from app.admin import bp, roles_required
from app.models import AdminRole


@bp.get("/audit")
@roles_required(AdminRole.AUDITOR)
def audit_search():
    return render_template("admin/audit.html")
