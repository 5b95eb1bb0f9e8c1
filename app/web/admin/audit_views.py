"""Audit search and compliance export (auditor only).

Search filters: time range (company-local dates, both ends inclusive), user (the WeCom user id
typed in is turned into its blind index, which is what ``actor`` stores; admin and system
actors such as ``admin:alice``, ``cli``, ``system`` match as typed) and event type. The export
(``audit_export``) takes the same filters plus a mandatory reason, and is itself audited before
the first byte is sent.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta

from flask import Response, flash, render_template, request
from flask_login import current_user
from flask_wtf import FlaskForm
from sqlalchemy import select
from wtforms import DateField, SelectField, StringField, TextAreaField
from wtforms.fields.choices import SelectChoice
from wtforms.validators import DataRequired, Length, Optional, ValidationError

from app.audit import signing as audit_signing
from app.audit.chain import EventType
from app.db import row_id, utcnow
from app.models import AdminRole, AuditEvent
from app.outbox.rows import user_hash
from app.web.admin import audit_admin, bp, roles_required, services
from app.web.admin.audit_export import ExportQuery, export_stream
from app.web.admin.limits import in_calendar

PAGE = 100
SYSTEM_ACTORS = ("cli", "system", "unknown")


class AuditFilterForm(FlaskForm):
    class Meta:
        csrf = False  # a GET search changes nothing

    since = DateField("From 起", validators=[Optional(), in_calendar])
    until = DateField("To 止", validators=[Optional(), in_calendar])
    user = StringField("User 用户 (WeCom user id, or admin:NAME)", validators=[Optional(), Length(max=80)])
    type = SelectField("Event type 事件类型", choices=[SelectChoice("", "all 全部"), *map(SelectChoice, EventType.ALL)],
                       validators=[Optional()])

    def validate_until(self, field) -> None:
        if field.data and self.since.data and field.data < self.since.data:
            raise ValidationError("the end date is before the start date")


class ExportForm(AuditFilterForm):
    class Meta:
        csrf = True

    reason = TextAreaField("Reason 导出原因 (recorded in the audit log)",
                           validators=[DataRequired(message="give the reason for this export"),
                                       Length(min=10, max=500, message="10 to 500 characters")])


def _query(form: AuditFilterForm) -> ExportQuery:
    tz = services().settings.timezone
    today = utcnow().astimezone(tz).date()
    since = form.since.data or today - timedelta(days=30)
    until = (form.until.data or today) + timedelta(days=1)
    actor = _actor(form.user.data)
    older = tuple(services().blind_index.candidates("wecom-user", form.user.data.strip())[1:]) \
        if actor and form.user.data.strip() != actor else ()
    return ExportQuery(_local_midnight(since, tz), _local_midnight(until, tz),
                       form.type.data or None, actor, older)


def _local_midnight(day: date, tz) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=tz)


def _actor(text: str | None) -> str | None:
    text = (text or "").strip()
    if not text:
        return None
    if text.startswith("admin:") or text in SYSTEM_ACTORS:
        return text
    return user_hash(services().blind_index, text)


@bp.get("/audit")
@roles_required(AdminRole.AUDITOR)
def audit_search():
    form = AuditFilterForm(request.args)
    events, before = [], request.args.get("before", type=row_id)
    svc = services()
    if form.validate():
        query = _query(form)
        stmt = select(AuditEvent).where(*query.conditions())
        if before:
            stmt = stmt.where(AuditEvent.seq < before)
        with svc.db.replica_reader() as session:  # the replica when one is set
            for row in session.scalars(stmt.order_by(AuditEvent.seq.desc()).limit(PAGE)):
                try:
                    payload = svc.audit.payload_of(row)
                except Exception:  # noqa: BLE001 - shown as such, the search goes on
                    payload = {"_error": "payload does not decrypt"}
                events.append((row, payload))
    next_args = ({**request.args.to_dict(), "before": events[-1][0].seq}
                 if len(events) == PAGE else None)
    return render_template("admin/audit.html", form=form, export_form=ExportForm(formdata=None),
                           events=events, next_args=next_args), 400 if form.errors else 200


@bp.post("/audit/export")
@roles_required(AdminRole.AUDITOR)
def audit_export():
    form = ExportForm()
    if not form.validate():
        for field, errors in form.errors.items():
            for error in errors:
                flash(f"{field}: {error}", "error")
        return render_template("admin/audit.html", form=AuditFilterForm(request.form),
                               export_form=form, events=[], next_args=None), 400
    svc = services()
    try:
        audit_signing.signing_key(svc.settings)
    except audit_signing.SigningKeyMissing as exc:
        flash(str(exc), "error")
        return render_template("admin/audit.html", form=AuditFilterForm(request.form),
                               export_form=form, events=[], next_args=None), 503
    query = _query(form)
    reason = form.reason.data.strip()
    with svc.db.transaction() as session:
        audit_admin(session, EventType.EXPORT, payload={"kind": "audit", "reason": reason,
                                                        **query.as_json()})
    stamp = utcnow().strftime("%Y%m%dT%H%M%SZ")
    stream = export_stream(svc, query, reason=reason, exported_by=f"admin:{current_user.name}")
    return Response(stream, mimetype="application/zip", headers={
        "Content-Disposition": f'attachment; filename="audit-export-{stamp}.zip"',
        "Cache-Control": "no-store"})
