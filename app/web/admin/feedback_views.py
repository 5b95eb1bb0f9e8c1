"""The dashboard's feedback section (``app.feedback.ratings``): satisfaction by day, department and
model for every dashboard role; for the admin role only (finance sees the aggregates alone) the
worst-rated answers, question and answer decrypted, and the documents and sections they cited,
worst first (``app.feedback.sources``): which documents to fix."""

from __future__ import annotations

from flask_login import current_user

from app.feedback import ratings as feedback
from app.feedback import sources as answer_sources
from app.models import AdminRole


def feedback_context(svc, filters) -> dict:
    reviewer = current_user.role == AdminRole.ADMIN
    with svc.db.replica_reader() as session:  # the replica when one is set (app.db)
        context = {"satisfaction": feedback.satisfaction(session, filters.since, filters.until,
                                                         filters.department)}
        context["worst_rated"] = feedback.worst_rated(
            session, svc, filters.since, filters.until, filters.department,
            decrypt=True) if reviewer else None
        context["worst_sources"] = answer_sources.worst_sources(
            session, svc, filters.since, filters.until, filters.department) if reviewer else None
    return context
