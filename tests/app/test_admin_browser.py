"""The admin pages in headless Chromium: charts drawn with the seeded data, a budget changed
through its form, an audit export downloaded and verified, roles, login redirect and CSRF."""

from __future__ import annotations

import json
import zipfile
from decimal import Decimal

import pytest
from sqlalchemy import func, select

from app.audit.signing import signing_key
from app.models import AuditEvent, Budget, UsageRecord
from app.web.admin.audit_export import verify_export
from tests.support.browser import sign_in

pytestmark = pytest.mark.browser

PAINTED = """id => {
  const chart = echarts.getInstanceByDom(document.getElementById(id));
  if (!chart) return null;
  const canvas = document.querySelector('#' + id + ' canvas');
  const ctx = canvas.getContext('2d');
  const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  let painted = 0;
  for (let i = 3; i < pixels.length; i += 4) { if (pixels[i] > 0) painted++; }
  return {series: chart.getOption().series.map(s => ({type: s.type, data: s.data})),
          painted: painted, width: canvas.width};
}"""


def _chart(page, chart_id: str) -> dict:
    page.wait_for_function("id => { const n = document.getElementById(id);"
                           " return n && echarts.getInstanceByDom(n); }", arg=chart_id)
    # ECharts animates its first draw: read the canvas once two reads 200 ms apart agree.
    drawn = page.evaluate(PAINTED, chart_id)
    for _ in range(25):
        page.wait_for_timeout(200)
        again = page.evaluate(PAINTED, chart_id)
        if again["painted"] == drawn["painted"]:
            break
        drawn = again
    return drawn


def test_dashboard_draws_the_seeded_spend(page, site):
    sign_in(page, "admin")
    page.goto("/admin/dashboard")
    with site.services.db.session() as session:
        by_dept = dict(session.execute(select(UsageRecord.department, func.sum(UsageRecord.cost))
                                       .group_by(UsageRecord.department)).all())
        total = session.scalar(select(func.sum(UsageRecord.cost)))
    assert page.inner_text("#total-cost") == f"{total:.4f}"

    daily = _chart(page, "chart-daily")
    cost, calls = daily["series"]
    assert cost["type"] == "line" and calls["type"] == "bar"
    assert sum(calls["data"]) == site.seeded["calls"]
    assert Decimal(str(round(sum(cost["data"]), 4))) == round(total, 4)
    assert daily["painted"] > 5000  # the canvas really has the chart on it

    departments = _chart(page, "chart-departments")
    drawn = {item["name"]: item["value"] for item in departments["series"][0]["data"]}
    assert drawn.keys() == by_dept.keys()
    assert all(abs(drawn[d] - float(by_dept[d])) < 1e-6 for d in drawn)
    assert departments["painted"] > 2000
    models = _chart(page, "chart-models")
    assert {item["name"] for item in models["series"][0]["data"]} <= {"glm-4", "glm-4-air", "glm-5"}
    # budgets over their thresholds are marked, and the alerts are listed
    assert page.locator(".bar.warn, .bar.over").count() >= 1
    assert page.locator("text=no alerts").count() == 0


def test_budget_change_through_the_form_is_saved(page, site):
    sign_in(page, "admin")
    page.goto("/admin/budgets")
    with site.services.db.session() as session:
        budget = session.scalars(select(Budget).where(Budget.scope_value == "sales")).one()
    page.click(f"a[href='/admin/budgets/{budget.id}/edit']")
    page.fill("input[name=limit]", "-1")
    page.click("button:has-text('Save')")
    assert "must be more than 0" in page.inner_text("main")
    page.fill("input[name=limit]", "12.5")
    page.fill("input[name=thresholds]", "60,90,100")
    page.click("button:has-text('Save')")
    page.wait_for_url("**/admin/budgets")
    row = page.locator("tr", has_text="sales").first
    assert "12.50" in row.inner_text() and "60,90,100" in row.inner_text()
    with site.services.db.session() as session:
        saved = session.get(Budget, budget.id)
        assert saved.limit == Decimal("12.5") and saved.thresholds == "60,90,100"


def test_auditor_exports_and_the_manifest_verifies(page, site, tmp_path):
    sign_in(page, "auditor")
    page.goto("/admin/audit?type=message_received")
    assert page.locator("td", has_text="message_received").count() >= 50
    page.fill("textarea[name=reason]", "browser test: quarterly compliance review")
    with page.expect_download() as info:
        page.click("button:has-text('Export zip')")
    download = info.value
    assert download.suggested_filename.startswith("audit-export-")
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    assert verify_export(path, signing_key(site.services.settings).public_key()) == []
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read("manifest.json"))
    with site.services.db.session() as session:
        expected = session.scalar(select(func.count()).select_from(AuditEvent)
                                  .where(AuditEvent.event_type == "message_received"))
    assert manifest["rows"] == expected == 60
    assert manifest["query"]["event_type"] == "message_received"
    assert manifest["chain"]["verified"] is True and manifest["exported_by"] == "admin:otto"
    assert manifest["reason"] == "browser test: quarterly compliance review"


def test_finance_cannot_open_audit_pages(page):
    sign_in(page, "finance")
    response = page.goto("/admin/audit")
    assert response.status == 403
    assert page.locator("nav a", has_text="Audit").count() == 0


def test_anonymous_is_sent_to_login(page):
    response = page.goto("/admin/dashboard")
    assert response.ok and "/admin/login" in page.url and "next=" in page.url
    assert page.locator("input[name=password]").count() == 1


def test_forged_csrf_token_is_refused(page):
    page.goto("/admin/login")
    page.fill("input[name=name]", "alice")
    page.fill("input[name=password]", "correct horse battery")
    page.eval_on_selector("input[name=csrf_token]", "el => el.value = 'IjEi.forged'")
    with page.expect_response("**/admin/login") as info:
        page.click("button:has-text('Sign in')")
    assert info.value.status == 400
    assert "CSRF" in page.inner_text("body")
    assert page.goto("/admin/dashboard") and "/admin/login" in page.url  # not signed in
