"""The cost dashboard (admin and finance): server-rendered tables plus ECharts charts.

The charts read the same numbers as the tables from one inline JSON block (``chart-data``),
so the page needs no second request; ``/admin/api/spend`` serves the same JSON for scripts.
"""

from __future__ import annotations

from flask import flash, jsonify, render_template, request

from app.tools import registry
from app.web.admin import COST_VIEWERS, bp, reports, roles_required, services
from app.web.admin.feedback_views import feedback_context
from app.web.admin.tools import tool_stats


def _filters():
    tz = services().settings.timezone
    try:
        return reports.parse_filters(request.args, tz), None
    except ValueError as exc:
        return reports.parse_filters({}, tz), str(exc)


def chart_data(spend: dict) -> dict:
    return {
        "days": spend["days"],
        "daily_cost": [float(v) for v in spend["daily_cost"]],
        "daily_calls": spend["daily_calls"],
        "departments": [{"name": r["department"] or "(none)", "value": float(r["cost"])}
                        for r in spend["departments"]],
        "models": [{"name": r["model"], "value": float(r["cost"])} for r in spend["models"]],
        "users": [{"name": r["user_hash"][:12], "value": float(r["cost"])}
                  for r in spend["top_users"]],
    }


@bp.get("/dashboard")
@roles_required(*COST_VIEWERS)
def dashboard():
    filters, error = _filters()
    if error:
        flash(f"Filter ignored: {error}", "error")
    svc = services()
    tz = svc.settings.timezone
    with svc.db.replica_reader() as session:  # the replica when one is set
        spend = reports.spend(session, filters)
        context = {
            "filters": filters, "spend": spend, "charts": chart_data(spend),
            "departments": reports.departments(session),
            "budgets": reports.budget_utilisation(session, tz, filters.department),
            "alerts": reports.recent_alerts(session),
            "messages": reports.message_counts(session, filters, tz),
            "failures": reports.delivery_failures(session, filters, tz),
            "currency": svc.settings.currency,
        }
    context.update(feedback_context(svc, filters))  # ratings of answers (app.feedback.ratings)
    # the tool calls' own latency and failures; their model turns are in the spend above
    context["tools"] = sorted(tool_stats(svc).items()) if registry.servers(svc) else []
    return render_template("admin/dashboard.html", **context)


@bp.get("/api/spend")
@roles_required(*COST_VIEWERS)
def spend_json():
    filters, error = _filters()
    if error:
        return jsonify(error=error), 400
    with services().db.replica_reader() as session:
        return jsonify(chart_data(reports.spend(session, filters)))
