"""Admin input that once made a 500 answers a 4xx: non-finite and enormous amounts, dates at the
calendar's ends (date arithmetic overflowed), ids beyond a 64-bit column."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.models import Budget, ModelPrice
from tests.app.web.admin.conftest import post

AMOUNTS = ["NaN", "nan", "sNaN", "Infinity", "-Infinity", "inf", "1e30", "1E+400", "99999999999999"]
GOOD_BUDGET = {"scope": "department", "scope_value": "2", "period": "month", "limit": "10",
               "action": "block", "thresholds": "50,80,100", "enabled": "y"}
GOOD_PRICE = {"model": "glm-4", "input_per_m": "10", "cached_per_m": "", "output_per_m": "30",
              "currency": "CNY", "valid_from": ""}
HUGE_ID = "9" * 30


def _count(services, model) -> int:
    with services.db.session() as session:
        return session.scalar(select(func.count()).select_from(model))


def test_budget_limits_must_be_finite_and_bounded(as_role, services):
    client = as_role("admin")
    for amount in AMOUNTS:
        response = post(client, "/admin/budgets/new", {**GOOD_BUDGET, "limit": amount})
        assert response.status_code == 400, (amount, response.status_code)
    assert _count(services, Budget) == 0
    assert post(client, "/admin/budgets/new", GOOD_BUDGET).status_code == 302
    with services.db.session() as session:
        budget_id = session.scalar(select(Budget.id))
    for amount in AMOUNTS:
        response = post(client, f"/admin/budgets/{budget_id}/edit", {**GOOD_BUDGET, "limit": amount})
        assert response.status_code == 400, (amount, response.status_code)


def test_prices_must_be_finite_and_bounded(as_role, services):
    client = as_role("admin")
    for field in ("input_per_m", "cached_per_m", "output_per_m"):
        for amount in AMOUNTS:
            response = post(client, "/admin/prices/new", {**GOOD_PRICE, field: amount})
            assert response.status_code == 400, (field, amount, response.status_code)
    assert _count(services, ModelPrice) == 0


@pytest.mark.parametrize("valid_from", ["0001-01-01T00:00", "9999-12-31T23:59"])
def test_a_price_valid_from_at_the_calendars_ends_is_a_400(as_role, services, valid_from):
    client = as_role("admin")
    response = post(client, "/admin/prices/new", {**GOOD_PRICE, "valid_from": valid_from})
    assert response.status_code == 400, response.status_code
    assert _count(services, ModelPrice) == 0


@pytest.mark.parametrize("query", ["until=9999-12-31", "since=9999-12-31&until=9999-12-31",
                                   "since=0001-01-01", "until=0001-01-01"])
def test_audit_search_at_the_calendars_ends_is_a_400(as_role, query):
    client = as_role("auditor")
    response = client.get(f"/admin/audit?{query}")
    assert response.status_code == 400, response.status_code
    assert "between" in response.get_data(as_text=True)


@pytest.mark.parametrize("query", ["until=0001-01-01", "since=0001-01-01&until=0001-01-02",
                                   "since=9999-12-30&until=9999-12-31"])
def test_dashboard_filters_at_the_calendars_ends_fall_back(as_role, query):
    client = as_role("admin")
    for path in ("/admin/dashboard", "/admin/api/spend"):
        response = client.get(f"{path}?{query}")
        assert response.status_code in (200, 400), (path, response.status_code)


def test_ids_beyond_a_64_bit_column_are_404(as_role):
    client = as_role("admin")
    assert client.get(f"/admin/budgets/{HUGE_ID}/edit").status_code == 404
    assert post(client, f"/admin/budgets/{HUGE_ID}/disable", {}, form_page="/admin/budgets").status_code == 404
    assert post(client, f"/admin/prices/{HUGE_ID}/retire", {}, form_page="/admin/prices").status_code == 404
    assert post(client, f"/admin/users/{HUGE_ID}/disable", {}, form_page="/admin/users").status_code == 404
    assert client.get(f"/admin/prices/new?from={HUGE_ID}").status_code == 200  # the empty form
    auditor = as_role("auditor")
    assert auditor.get(f"/admin/audit?before={HUGE_ID}").status_code in (200, 400)
