"""The dashboard reads the rollups: totals, groups, budgets, alerts, message counts, filters."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from app.accounting import Accounting, Usage, set_budget, set_price
from app.db import utcnow
from app.models import InboundMessage


def _usage(services):
    accounting = Accounting(services.db, services.settings.timezone, audit=services.audit)
    with services.db.transaction() as session:
        set_price(session, "glm-4", 10, 2, 30, valid_from=utcnow() - timedelta(days=1))
        set_budget(session, "department", "2", "month", "0.05", thresholds="50,80,100")
    for user, dept in (("u" * 64, "2"), ("v" * 64, "2"), ("w" * 64, "5")):
        accounting.settle(None, Usage(user_hash=user, department=dept, model="glm-4",
                                      prompt_tokens=1000, completion_tokens=500))  # 0.025 each
    with services.db.transaction() as session:
        for i, status in enumerate(("answered", "answered", "failed")):
            session.add(InboundMessage(dedup_hash=f"d{i}", user_hash="u", msg_type="text",
                                       wecom_create_time=0, status=status))


def test_dashboard_shows_spend_budgets_alerts_and_messages(as_role, services):
    _usage(services)
    client = as_role("finance")
    page = client.get("/admin/dashboard").get_data(as_text=True)
    assert 'id="total-cost">0.0750<' in page
    assert 'id="answered">2<' in page and 'id="failed">1<' in page
    assert ">" + "u" * 12 + "</code>" in page  # the blind index, shortened
    assert "100.0%" in page  # department 2 spent 0.05 of 0.05
    assert "echarts.min.js" in page and 'id="chart-data"' in page
    assert page.count("100%</td>") >= 1  # the 100 % alert is listed

    five = client.get("/admin/api/spend?department=5").get_json()
    assert sum(five["daily_cost"]) == 0.025 and five["departments"] == [{"name": "5", "value": 0.025}]
    assert client.get("/admin/api/spend?since=2026-13-01").status_code == 400


def test_bad_filter_falls_back_with_a_message(as_role):
    page = as_role("admin").get("/admin/dashboard?since=2027-01-02&until=2027-01-01")
    assert page.status_code == 200 and "the start date is after the end date" in page.get_data(as_text=True)


def test_vendored_echarts_is_served(as_role):
    response = as_role("admin").get("/admin/static/vendor/echarts.min.js")
    assert response.status_code == 200 and b"echarts" in response.data[:2000]
    response.close()


def test_money_sums_are_exact(services):
    _usage(services)
    from app.web.admin.reports import Filters, spend

    today = utcnow().astimezone(services.settings.timezone).date()
    with services.db.session() as session:
        result = spend(session, Filters(today, today))
    assert result["total_cost"] == Decimal("0.075000")


def test_delivery_failures_panel_lists_reasons_and_retrying(as_role, services):
    with services.db.transaction() as session:
        for i, (status, reason) in enumerate((("failed", "wecom: errcode 40008"),
                                              ("failed", "wecom: errcode 40008"),
                                              ("failed", "gave up after 5 attempts: wecom: HTTP 503"),
                                              ("queued", "wecom: HTTP 502 from /cgi-bin/message/send"),
                                              ("answered", None))):
            session.add(InboundMessage(dedup_hash=f"f{i}", user_hash="u", msg_type="text", attempts=i + 1,
                                       wecom_create_time=0, status=status, failure_reason=reason))
    page = as_role("admin").get("/admin/dashboard").get_data(as_text=True)
    panel = page[page.index('id="delivery-failures"'):page.index("Top users")]
    assert 'id="failures-total">3<' in panel and 'id="failures-retrying">1<' in panel
    assert "<code>wecom: errcode 40008</code></td><td class=\"num\">2<" in panel
    assert "gave up after 5 attempts: wecom: HTTP 503" in panel
