"""Budget and price forms: create, edit, disable, validation errors, audit events."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

from sqlalchemy import select

from app.db import utcnow
from app.models import AuditEvent, Budget, ModelPrice
from app.outbox.rows import user_hash
from tests.app.web.admin.conftest import post

NEW = "/admin/budgets/new"


def _changes(services):
    with services.db.session() as session:
        rows = list(session.scalars(select(AuditEvent).where(
            AuditEvent.event_type == "admin_change").order_by(AuditEvent.seq)))
        return [(row.actor, services.audit.payload_of(row)) for row in rows]


def test_budget_create_edit_disable(as_role, services):
    client = as_role("admin")
    response = post(client, NEW, {"scope": "department", "scope_value": "2", "period": "month",
                                  "limit": "100.50", "action": "warn", "thresholds": "80,50",
                                  "enabled": "y"})
    assert response.status_code == 302, response.get_data(as_text=True)
    with services.db.session() as session:
        budget = session.scalars(select(Budget)).one()
    assert (budget.scope_value, budget.limit, budget.action, budget.thresholds, budget.enabled) == \
        ("2", Decimal("100.500000"), "warn", "50,80", True)

    edit = f"/admin/budgets/{budget.id}/edit"
    assert "100.500000" in client.get(edit).get_data(as_text=True)
    response = post(client, edit, {"limit": "200", "action": "block", "thresholds": "90",
                                   "enabled": "y"})
    assert response.status_code == 302, response.get_data(as_text=True)
    response = post(client, f"/admin/budgets/{budget.id}/disable", {}, form_page="/admin/budgets")
    assert response.status_code == 302
    with services.db.session() as session:
        budget = session.get(Budget, budget.id)
    assert (budget.limit, budget.action, budget.thresholds, budget.enabled) == \
        (Decimal("200.000000"), "block", "90", False)

    changes = _changes(services)
    assert [p["action"] for _, p in changes] == ["budget_create", "budget_edit", "budget_disable"]
    assert changes[1][1]["before"]["limit"] == "100.500000" and changes[1][1]["after"]["limit"] == "200.000000"
    assert all(actor == "admin:alice" for actor, _ in changes)


def test_user_budget_stores_the_blind_index(as_role, services):
    client = as_role("admin")
    post(client, NEW, {"scope": "user", "scope_value": "zhangsan", "period": "day",
                       "limit": "5", "action": "block", "thresholds": "50,100", "enabled": "y"})
    with services.db.session() as session:
        budget = session.scalars(select(Budget)).one()
    assert budget.scope_value == user_hash(services.blind_index, "zhangsan")
    assert "zhangsan" not in json.dumps(_changes(services))


def test_budget_validation_errors(as_role, services):
    client = as_role("admin")
    cases = [
        ({"limit": "-3"}, "must be more than 0"),
        ({"limit": "lots"}, "Not a valid decimal value"),
        ({"thresholds": "50,abc"}, "whole percentages"),
        ({"thresholds": "0,5000"}, "between 1 and 1000"),
        ({"scope_value": ""}, "needs the department it applies to"),
        ({"scope_value": "rd"}, "a WeCom department id is a whole number"),
        ({"scope_value": "9" * 30}, "a WeCom department id is a whole number"),
        ({"scope_value": "7\x00"}, "no control characters"),
        ({"period": "year"}, "Not a valid choice"),
    ]
    good = {"scope": "department", "scope_value": "2", "period": "month", "limit": "10",
            "action": "block", "thresholds": "50,80,100", "enabled": "y"}
    for change, message in cases:
        response = post(client, NEW, {**good, **change})
        assert response.status_code == 400, change
        assert message in response.get_data(as_text=True), (change, message)
    assert post(client, NEW, good).status_code == 302
    duplicate = post(client, NEW, good)
    assert duplicate.status_code == 400 and "already has a budget" in duplicate.get_data(as_text=True)
    with services.db.session() as session:
        assert len(session.scalars(select(Budget)).all()) == 1


def test_auditor_and_finance_cannot_edit_budgets(app, users, services):
    from tests.app.web.admin.conftest import csrf_token, login

    for name in ("otto", "fiona"):
        client = app.test_client()
        login(client, name)
        assert client.get(NEW).status_code == 403
        token = csrf_token(client, "/admin/login")  # a valid token of this session
        response = client.post(NEW, data={"scope": "global", "period": "day", "limit": "1",
                                          "action": "block", "thresholds": "100",
                                          "csrf_token": token})
        assert response.status_code == 403
        assert client.post("/admin/budgets/1/disable", data={"csrf_token": token}).status_code == 403
    with services.db.session() as session:
        assert session.scalars(select(Budget)).all() == []


def test_price_versions(as_role, services):
    client = as_role("admin")
    response = post(client, "/admin/prices/new", {"model": "glm-4", "input_per_m": "10",
                                                   "cached_per_m": "", "output_per_m": "30",
                                                   "currency": "cny", "valid_from": ""})
    assert response.status_code == 302, response.get_data(as_text=True)
    later = (utcnow().astimezone(services.settings.timezone) + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
    response = post(client, "/admin/prices/new", {"model": "glm-4", "input_per_m": "8",
                                                   "output_per_m": "24", "currency": "CNY",
                                                   "valid_from": later})
    assert response.status_code == 302
    bad = post(client, "/admin/prices/new", {"model": "glm 4!", "input_per_m": "-1",
                                              "output_per_m": "", "currency": "yuan"})
    text = bad.get_data(as_text=True)
    assert bad.status_code == 400
    assert "letters, digits" in text and "must not be negative" in text and "3-letter" in text
    page = client.get("/admin/prices").get_data(as_text=True)
    assert "in effect" in page and "scheduled" in page
    with services.db.session() as session:
        now_price, future = session.scalars(select(ModelPrice).order_by(ModelPrice.valid_from)).all()
    assert now_price.cached_input_per_m == Decimal(10) and now_price.currency == "CNY"
    post(client, f"/admin/prices/{now_price.id}/retire", {}, form_page="/admin/prices")
    post(client, f"/admin/prices/{future.id}/retire", {}, form_page="/admin/prices")
    with services.db.session() as session:
        assert [p.id for p in session.scalars(select(ModelPrice))] == [now_price.id]
    actions = [p["action"] for _, p in _changes(services)]
    assert actions == ["price_create", "price_create", "price_retire"]
