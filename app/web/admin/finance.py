"""The finance export (finance role): cost per period x department x user x model as CSV.

Each row carries the accounting subject and invoice item finance books it under
(``FINANCE_ACCOUNTING_SUBJECT``, default 研发费用-外部技术服务费; ``FINANCE_INVOICE_ITEM``,
default AI模型调用服务费). Users are their blind index: finance allocates cost, it does not
need to know who asked what. The file starts with a UTF-8 BOM so that Excel shows the Chinese
text; it is streamed row by row from the rollups. Every export is an ``export`` audit event.
"""

from __future__ import annotations

import csv
import io

from flask import Response, flash, redirect, request, url_for

from app.audit.chain import EventType
from app.db import utcnow
from app.models import AdminRole
from app.web.admin import audit_admin, bp, reports, roles_required, services


def _line(values) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow(values)
    return out.getvalue().encode()


def finance_csv(svc, filters: reports.Filters, granularity: str):
    settings = svc.settings
    extra = (settings.currency, settings.finance_accounting_subject, settings.finance_invoice_item)
    yield "\ufeff".encode() + _line(reports.FINANCE_COLUMNS)
    # Streamed to the client from the replica when one is set (else a primary reader that never
    # holds the writers up); the export's audit event was written on the primary before.
    with svc.db.replica_reader() as session:
        for row in reports.finance_rows(session, filters, granularity):
            yield _line((*row[:8], f"{row[8]:.6f}", *extra))


@bp.post("/finance/export")
@roles_required(AdminRole.FINANCE)
def finance_export():
    svc = services()
    granularity = request.form.get("granularity", "month")
    try:
        filters = reports.parse_filters(request.form, svc.settings.timezone)
        if granularity not in ("day", "month"):
            raise ValueError("granularity must be day or month")
    except ValueError as exc:
        flash(f"Export refused: {exc}", "error")
        return redirect(url_for("admin.dashboard"))
    with svc.db.transaction() as session:
        audit_admin(session, EventType.EXPORT, payload={"kind": "finance", "granularity": granularity,
                                                        **filters.as_args()})
    name = f"ai-cost-{filters.since:%Y%m%d}-{filters.until:%Y%m%d}-{utcnow():%H%M%S}.csv"
    return Response(finance_csv(svc, filters, granularity), mimetype="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="{name}"',
                             "Cache-Control": "no-store"})
