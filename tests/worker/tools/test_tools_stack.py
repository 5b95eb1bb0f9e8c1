"""The demo's two conversations through the whole stack: the WeCom emulator, gunicorn, the Celery
worker, the demo MCP server (a real process over streamable HTTP) and the emulator's own card
click; the answers in the emulator's chat, the confirmation card, the audit entries."""

from __future__ import annotations

import pytest

from app.db import Database
from app.services import Services
from app.tools import registry
from tests.support import mcp_servers
from tests.support.env import settings_from
from tests.support.stack import Stack, select_rows, wait_for

pytestmark = pytest.mark.integration
ASKER = "lina"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tools-stack")
    seed, pem = mcp_servers.keypair(tmp)
    port = mcp_servers.free_port()
    server = mcp_servers.start(["-m", "emulator.mcp_server", "--port", str(port), "--public-key", str(pem)], port)
    s = Stack(tmp, redis_db=5, extra_env={"TOOLS_ENABLED": "true", "TOOLS_SIGNING_KEY": seed,
                                          "TOOLS_PLANNER": "intent"})
    try:
        s.start()
        db = Database(s.db.url)
        services = Services(settings_from(s.env), db)
        registry.add_server(services, "demo", "http", f"http://127.0.0.1:{port}/mcp")
        for tool in ("leave_balance", "expense_claim_status", "book_meeting_room"):
            registry.allow(services, "demo", tool, None)
        db.dispose()
        yield s
    finally:
        s.stop()
        mcp_servers.stop(server)


def cards(stack) -> list[dict]:
    items = stack.emu("GET", "messages", params={"touser": ASKER})["messages"]
    return [m for m in items if m.get("msgtype") == "template_card"]


def test_leave_and_a_confirmed_booking_in_the_emulator(stack):
    stack.send(ASKER, "我还有几天年假")
    wait_for(lambda: len(stack.replies(ASKER)) >= 1, 60, what="the leave answer")
    assert "还剩" in stack.replies(ASKER)[-1] and "李娜" in stack.replies(ASKER)[-1]

    stack.send(ASKER, "帮我订明天下午两点的会议室")
    wait_for(lambda: len(stack.replies(ASKER)) >= 2 and cards(stack), 60, what="the confirmation")
    assert "确认" in stack.replies(ASKER)[-1]
    card = cards(stack)[-1]
    task_id = (card.get("template_card") or card.get("payload") or {}).get("task_id")
    assert task_id and task_id.startswith("tool-")
    stack.emu("POST", "card_click", json={"userid": ASKER, "task_id": task_id, "key": "tool_confirm"})
    wait_for(lambda: len(stack.replies(ASKER)) >= 3, 60, what="the booking's result")
    assert stack.replies(ASKER)[-1].startswith("已完成") and "14:00" in stack.replies(ASKER)[-1]

    events = select_rows(stack.db.url, "SELECT outcome, actor FROM audit_events "
                                       "WHERE event_type = 'tool_call' ORDER BY seq")
    assert [e["outcome"] for e in events] == ["ok", "proposed", "ok"]
    assert len({e["actor"] for e in events}) == 1 and ASKER not in events[0]["actor"]
