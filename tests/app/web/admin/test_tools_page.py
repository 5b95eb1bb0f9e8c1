"""The admin's tools page on both databases: register a server (its credentials sealed and
never shown), allow and revoke tools, remove the server, each an audited admin change; the
per-tool calls, failures and latency from the tool_call audit events; admins only."""

from __future__ import annotations

from types import SimpleNamespace

from sqlalchemy import select

from app.models import AuditEvent
from app.tools import registry
from app.tools.models import ToolServer
from tests.app.web.admin.conftest import csrf_token
from worker.tools import record

PAGE = "/admin/tools"


def post(client, path, data):
    return client.post(f"{PAGE}{path}", data={"csrf_token": csrf_token(client, PAGE), **data})


def actions(services):
    with services.db.session() as session:
        rows = session.scalars(select(AuditEvent).where(AuditEvent.event_type == "admin_change")
                               .order_by(AuditEvent.seq))
        return [services.audit.payload_of(r)["action"] for r in rows
                if services.audit.payload_of(r)["action"].startswith("tools_")]


def test_register_allow_stats_revoke_remove(as_role, services):
    client = as_role("admin")
    added = post(client, "/servers", {"name": "hr", "transport": "http", "target": "http://127.0.0.1:9/mcp",
                                      "secrets": "X-Api-Key=gateway-secret-0123456789"})
    assert added.status_code == 302
    bad = post(client, "/servers", {"name": "Bad Name", "transport": "http", "target": "http://x/mcp"})
    assert bad.status_code == 400 and "lower-case" in bad.get_data(as_text=True)
    assert post(client, "/allow", {"server": "hr", "tool": "leave_balance", "departments": "2,3",
                                   "side_effect": "0"}).status_code == 302
    assert post(client, "/allow", {"server": "hr", "tool": "book_room", "departments": "all",
                                   "side_effect": "1"}).status_code == 302
    assert post(client, "/allow", {"server": "nope", "tool": "x", "departments": "all"}).status_code == 400
    row = SimpleNamespace(id=1, user_hash="u" * 64, request_id=None)
    for outcome, ms in (("ok", 0.1), ("ok", 0.3), ("timeout", 2.0), ("proposed", 0)):
        record.tool_call(services, row, server="hr", tool="leave_balance", arguments={}, outcome=outcome,
                         latency_s=ms)
    page = client.get(PAGE).get_data(as_text=True)
    assert "gateway-secret" not in page and "X-Api-Key" in page  # the name, never the value
    assert "leave_balance</td><td>2,3</td>" in page and "book_room</td><td>everyone</td>" in page
    assert '<td class="num">3</td><td class="num">1</td><td class="num">800</td>' in page
    with services.db.session() as session:
        assert "gateway-secret" not in session.scalars(select(ToolServer)).one().secrets_enc
    assert post(client, "/revoke", {"server": "hr", "tool": "leave_balance"}).status_code == 302
    assert set(registry.policies(services)) == {(registry.server(services, "hr").id, "book_room")}
    assert post(client, "/revoke", {"server": "hr", "tool": "*", "everything": "y"}).status_code == 302
    assert registry.servers(services) == []
    assert actions(services) == ["tools_server_added", "tools_allowed", "tools_allowed", "tools_revoked",
                                 "tools_server_removed"]


def test_only_admins(as_role):
    for role in ("finance", "auditor"):
        assert as_role(role).get(PAGE).status_code == 403


def test_the_cost_dashboard_shows_each_tools_calls_failures_and_latency(as_role, services):
    client = as_role("admin")
    assert 'id="tool-calls"' not in client.get("/admin/dashboard").get_data(as_text=True)  # no server yet
    assert post(client, "/servers", {"name": "hr", "transport": "http",
                                     "target": "http://127.0.0.1:9/mcp"}).status_code == 302
    row = SimpleNamespace(id=1, user_hash="u" * 64, request_id=None)
    for outcome, seconds in (("ok", 0.2), ("error", 0.4)):
        record.tool_call(services, row, server="hr", tool="expense_claim_status", arguments={},
                         outcome=outcome, latency_s=seconds)
    page = as_role("finance").get("/admin/dashboard").get_data(as_text=True)
    assert ('<td>hr</td><td>expense_claim_status</td><td class="num">2</td><td class="num">1</td>'
            '<td class="num">300</td>') in page
