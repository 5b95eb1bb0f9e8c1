"""The finance CSV: columns, accounting subject and invoice item, roles, audit."""

from __future__ import annotations

import csv
import io
from datetime import date

from sqlalchemy import select

from app.db import Database
from app.models import AuditEvent, UsageDaily
from tests.app.web.admin.conftest import post


def _rollups(services):
    with services.db.transaction() as session:
        for day, dept, user, cost in ((date(2026, 11, 30), "2", "a" * 64, "1.5"),
                                      (date(2026, 12, 1), "2", "a" * 64, "2.25"),
                                      (date(2026, 12, 2), "2", "a" * 64, "0.25"),
                                      (date(2026, 12, 2), "5", "b" * 64, "4")):
            session.add(UsageDaily(day=day, department=dept, user_hash=user, model="glm-4",
                                   calls=1, prompt_tokens=10, cached_tokens=0,
                                   completion_tokens=5, cost=cost))


def _rows(response):
    text = response.get_data(as_text=True)
    assert text.startswith("\ufeff")
    return list(csv.DictReader(io.StringIO(text[1:])))


def test_finance_export_by_month_and_day(as_role, services):
    _rollups(services)
    client = as_role("finance")
    form = {"since": "2026-11-01", "until": "2026-12-31", "granularity": "month"}
    response = post(client, "/admin/finance/export", form, form_page="/admin/dashboard")
    assert response.status_code == 200 and response.mimetype == "text/csv"
    rows = _rows(response)
    assert [(r["period"], r["department"], r["cost"]) for r in rows] == [
        ("2026-11", "2", "1.500000"), ("2026-12", "2", "2.500000"), ("2026-12", "5", "4.000000")]
    assert {r["accounting_subject"] for r in rows} == {"研发费用-外部技术服务费"}
    assert {r["invoice_item"] for r in rows} == {"AI模型调用服务费"}
    assert rows[0]["user"] == "a" * 64 and rows[0]["currency"] == "CNY"

    daily = _rows(post(client, "/admin/finance/export", {**form, "granularity": "day",
                                                        "department": "2"},
                       form_page="/admin/dashboard"))
    assert [r["period"] for r in daily] == ["2026-11-30", "2026-12-01", "2026-12-02"]

    with services.db.session() as session:
        exports = list(session.scalars(select(AuditEvent).where(AuditEvent.event_type == "export")))
    assert [services.audit.payload_of(e)["granularity"] for e in exports] == ["month", "day"]


def test_finance_columns_are_configurable(database_url, users):
    from app.services import Services
    from app.web.factory import create_app
    from tests.app.web.admin.conftest import login
    from tests.support.env import make_env, settings_from

    settings = settings_from(make_env(DATABASE_URL=database_url, SESSION_COOKIE_SECURE="false",
                                      FINANCE_ACCOUNTING_SUBJECT="管理费用-信息服务费",
                                      FINANCE_INVOICE_ITEM="信息技术服务费"))
    db = Database(database_url)
    try:
        services = Services(settings, db)
        _rollups(services)
        client = create_app(services=services).test_client()
        login(client, "fiona")
        rows = _rows(post(client, "/admin/finance/export", {"since": "2026-12-01",
                                                            "until": "2026-12-02"},
                          form_page="/admin/dashboard"))
        assert {(r["accounting_subject"], r["invoice_item"]) for r in rows} == {
            ("管理费用-信息服务费", "信息技术服务费")}
    finally:
        db.dispose()


def test_only_finance_exports_costs(as_role):
    client = as_role("admin")
    assert post(client, "/admin/finance/export", {}, form_page="/admin/dashboard").status_code == 403
