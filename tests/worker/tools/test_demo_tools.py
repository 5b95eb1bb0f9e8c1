"""The demo's two conversations end to end: a signed WeCom callback into the real Flask app, the
real worker's processor (fake WeCom and directory), the demo MCP server as a real process over
streamable HTTP, the asker's identity token, the confirmation card and its click, the audit."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from sqlalchemy import select

from app.models import AuditEvent, InboundMessage
from app.services import Services
from app.tools import identity, mcp_calls, registry
from app.web.factory import create_app
from tests.support import mcp_servers
from tests.support.env import settings_from
from tests.worker.test_processor_data import FakeWeCom, post_message, post_xml
from worker.conversation import ConversationStore
from worker.processor import MessageProcessor

ASKER = "lina"


class CardWeCom(FakeWeCom):
    def __init__(self):
        super().__init__()
        self.cards, self.updates = [], []

    def send_template_card(self, touser, card, **_):
        self.cards.append((touser, card))
        return {"errcode": 0, "response_code": "rc"}

    def update_template_card(self, userids, code, **kwargs):
        self.updates.append((userids, code, kwargs))
        return {"errcode": 0}


class NoModel:
    model_name = "none"

    def generate(self, messages, params):  # the intent planner never asks the model
        raise AssertionError("the model was asked")


@pytest.fixture
def demo(tmp_path):
    seed, pem = mcp_servers.keypair(tmp_path)
    port = mcp_servers.free_port()
    process = mcp_servers.start(["-m", "emulator.mcp_server", "--port", str(port), "--public-key", str(pem)], port)
    yield seed, f"http://127.0.0.1:{port}/mcp"
    mcp_servers.stop(process)


@pytest.fixture
def tool_services(env, db, redis_client, demo):
    seed, url = demo
    settings = settings_from(env, tools_enabled="true", tools_signing_key=seed, tools_planner="intent",
                             feedback_cards="false")
    services = Services(settings, db)
    registry.add_server(services, "demo", "http", url, {"X-Gateway-Key": "k" * 24})
    registry.allow(services, "demo", "leave_balance", [9])
    registry.allow(services, "demo", "book_meeting_room", None)
    registry.allow(services, "demo", "expense_claim_status", [3])  # not the asker's department
    return services


def card_event(client, services, task_id: str, key: str, user: str = ASKER, later: int = 0):
    """``later``: seconds after now (a second click is a new event, not WeCom's retry)."""
    s = services.settings
    xml = (f"<xml><ToUserName><![CDATA[{s.wecom_corp_id}]]></ToUserName>"
           f"<FromUserName><![CDATA[{user}]]></FromUserName><CreateTime>{int(time.time()) + later}</CreateTime>"
           f"<MsgType><![CDATA[event]]></MsgType><Event><![CDATA[template_card_event]]></Event>"
           f"<EventKey><![CDATA[{key}]]></EventKey><TaskId><![CDATA[{task_id}]]></TaskId>"
           f"<CardType><![CDATA[button_interaction]]></CardType>"
           f"<ResponseCode><![CDATA[rc-{key}]]></ResponseCode>"
           f"<AgentID>{s.wecom_agent_id}</AgentID></xml>")
    return post_xml(client, services, xml)


def last_id(services) -> int:
    with services.db.session() as session:
        return session.scalars(select(InboundMessage.id).order_by(InboundMessage.id.desc())).first()


def tool_events(services) -> list[tuple[str, dict]]:
    with services.db.session() as session:
        rows = session.scalars(select(AuditEvent).where(AuditEvent.event_type == "tool_call")
                               .order_by(AuditEvent.seq)).all()
        return [(e.outcome, services.audit.payload_of(e)) for e in rows]


def test_leave_balance_and_a_booking_confirmed_by_the_asker(tool_services):
    services = tool_services
    wecom = CardWeCom()
    processor = MessageProcessor(services, NoModel(), wecom, ConversationStore(services.redis, services.cipher, 3600, 20))
    client = create_app(services=services).test_client()

    # only the tools allowed for the asker's departments (7, 9) are offered
    offered = {t.tool for t in processor.tools.catalog.offered((7, 9))}
    assert offered == {"leave_balance", "book_meeting_room"}

    post_message(client, services, "我还有几天年假", 501, user=ASKER)
    assert processor.process(last_id(services)).status == "done"
    answer = wecom.sent[-1][2]
    assert "李娜" in answer and "还剩" in answer and "年假" in answer

    post_message(client, services, "帮我订明天下午两点的会议室", 502, user=ASKER)
    processor.process(last_id(services))
    assert "确认" in wecom.sent[-1][2] and "book_meeting_room" in wecom.sent[-1][2]
    [(touser, card)] = wecom.cards
    assert touser == ASKER and card["card_type"] == "button_interaction"
    task_id = card["task_id"]

    # someone else's click runs nothing
    card_event(client, services, task_id, "tool_confirm", user="wangfang")
    processor.process(last_id(services))
    assert "只有发起" in wecom.sent[-1][2]

    card_event(client, services, task_id, "tool_confirm")
    processor.process(last_id(services))
    assert wecom.sent[-1][2].startswith("已完成") and "14:00" in wecom.sent[-1][2]
    card_event(client, services, task_id, "tool_confirm", later=5)  # a second click: once only
    processor.process(last_id(services))
    assert "已过期或已经处理过" in wecom.sent[-1][2]

    outcomes = [(o, p["tool"]) for o, p in tool_events(services)]
    assert outcomes == [("ok", "leave_balance"), ("proposed", "book_meeting_room"),
                        ("refused", "book_meeting_room"), ("ok", "book_meeting_room")]
    booked = tool_events(services)[-1][1]
    assert booked["side_effect"] is True and booked["arguments"]["start"].endswith("14:00+08:00")
    assert "预订" in booked["result"] and booked["latency_ms"] >= 0
    with services.db.session() as session:  # sealed: nothing of the call in clear
        stored = " ".join(e.payload_enc for e in session.scalars(select(AuditEvent)))
    assert "book_meeting_room" not in stored and "李娜" not in stored


def test_the_demo_server_answers_only_a_valid_token_and_about_its_bearer(tool_services):
    services = tool_services
    server = registry.server(services, "demo")
    assert server.secrets == {"X-Gateway-Key": "k" * 24}
    key = identity.signing_key(services.settings)
    good = identity.issue(key, issuer="wecom-bot", audience="demo", user_id="zhangwei", departments=[2])
    result = mcp_calls.call_tool(server, "leave_balance", {}, good, 10, 4000)
    assert not result.is_error and "张伟" in result.text
    for token in ("", "not-a-jwt",
                  identity.issue(key, issuer="wecom-bot", audience="other", user_id="zhangwei", departments=[]),
                  identity.issue(key, issuer="wecom-bot", audience="demo", user_id="zhangwei", departments=[],
                                 now=time.time() - 600)):
        refused = mcp_calls.call_tool(server, "leave_balance", {}, token, 10, 4000)
        assert refused.is_error and "unauthorized" in refused.text
    # a model-written "user" argument is no identity: the tool has no such parameter
    forged = mcp_calls.call_tool(server, "leave_balance", {"user": "zhangwei"}, "", 10, 4000)
    assert forged.is_error


def test_the_demo_server_over_stdio_reads_the_token_from_meta(tool_services, demo, tmp_path):
    services = tool_services
    pem = tmp_path / "tools-public.pem"
    registry.add_server(services, "demostdio", "stdio",
                        f"{sys.executable} -m emulator.mcp_server --stdio --audience demostdio --public-key {pem}")
    server = registry.server(services, "demostdio")
    key = identity.signing_key(services.settings)
    token = identity.issue(key, issuer="wecom-bot", audience="demostdio", user_id="xuli", departments=[7])
    result = mcp_calls.call_tool(server, "expense_claim_status", {}, token, 20, 4000)
    assert not result.is_error and "EX-" in result.text
    assert json.loads(json.dumps([t.as_dict() for t in mcp_calls.list_tools(server, 20)]))
    assert subprocess  # the stdio server is the SDK's, started by the client


class ToolModel:
    """A model that calls the tool it is scripted to, then answers from the result it was shown."""

    model_name = "glm-4"

    def __init__(self, function: str, arguments: dict):
        self.function, self.arguments, self.prompts = function, arguments, []

    def generate(self, messages, params):
        from app.llm import Generation
        from app.llm.tools import ToolCall

        self.prompts.append(messages)
        offered = {t.name for t in params.tools}
        if messages[-1]["role"] == "user" and self.function in offered:
            return Generation(text="", model="glm-4", prompt_tokens=300, completion_tokens=30,
                              finish_reason="tool_calls",
                              tool_calls=[ToolCall("call_1", self.function, json.dumps(self.arguments))])
        return Generation(text="据查询：" + messages[-1]["content"].split("\n")[1], model="glm-4",
                          prompt_tokens=400, completion_tokens=40)


def test_the_model_planner_counts_every_step_and_a_typed_answer_decides(tool_services):
    from app.accounting import set_budget, set_price
    from app.models import UsageRecord

    services = tool_services
    services.settings.tools_planner = "model"
    with services.db.transaction() as session:
        set_price(session, "glm-4", 10, 2, 30)
        set_budget(session, "global", "", "day", "100")
    wecom = CardWeCom()
    conversations = ConversationStore(services.redis, services.cipher, 3600, 20)
    client = create_app(services=services).test_client()

    model = ToolModel("demo__leave_balance", {})
    post_message(client, services, "我的年假还剩几天", 601, user=ASKER)
    MessageProcessor(services, model, wecom, conversations).process(last_id(services))
    assert wecom.sent[-1][2].startswith("据查询：李娜") and len(model.prompts) == 2
    assert model.prompts[1][-1]["role"] == "tool"
    with services.db.session() as session:  # both model turns charged: the larger of the
        usage = session.scalars(select(UsageRecord).order_by(UsageRecord.id)).all()  # report and
    assert len(usage) == 2  # the estimate, which holds the offered tools' schemas too
    assert usage[0].prompt_tokens > 300 and usage[0].completion_tokens >= 30
    assert usage[1].prompt_tokens > usage[0].prompt_tokens and usage[1].completion_tokens >= 40
    assert all(u.cost > 0 for u in usage)

    model = ToolModel("demo__book_meeting_room", {"start": "2026-12-09T10:00+08:00", "room": "B201"})
    post_message(client, services, "后天上午十点帮我订 B201", 602, user=ASKER)
    MessageProcessor(services, model, wecom, conversations).process(last_id(services))
    assert "确认" in wecom.sent[-1][2]
    post_message(client, services, "取消", 603, user=ASKER)
    MessageProcessor(services, model, wecom, conversations).process(last_id(services))
    assert wecom.sent[-1][2] == "已取消，没有执行任何操作。"
    assert not list(services.redis.scan_iter("tools:confirm:last:*"))  # a later 确认 opens nothing

    post_message(client, services, "后天上午十点帮我订 B201", 605, user=ASKER)
    MessageProcessor(services, model, wecom, conversations).process(last_id(services))
    post_message(client, services, "确认", 606, user=ASKER)
    MessageProcessor(services, model, wecom, conversations).process(last_id(services))
    assert wecom.sent[-1][2].startswith("已完成") and "B201" in wecom.sent[-1][2]
    assert [o for o, _ in tool_events(services)] == ["ok", "proposed", "cancelled", "proposed", "ok"]


def test_a_confirmation_expires(tool_services):
    services = tool_services
    wecom = CardWeCom()
    processor = MessageProcessor(services, NoModel(), wecom, ConversationStore(services.redis, services.cipher, 3600, 20))
    client = create_app(services=services).test_client()
    post_message(client, services, "帮我订明天下午三点的会议室", 701, user=ASKER)
    processor.process(last_id(services))
    task_id = wecom.cards[-1][1]["task_id"]
    services.redis.delete(f"tools:confirm:{task_id.removeprefix('tool-')}")  # its TTL ran out
    card_event(client, services, task_id, "tool_confirm")
    processor.process(last_id(services))
    assert "已过期" in wecom.sent[-1][2]
    assert [o for o, _ in tool_events(services)] == ["proposed"]


def test_two_decisions_racing_run_the_action_once(tool_services):
    """Both loaded the pending call before either decided: the SET NX lets one through."""
    from worker.tools.confirm import Confirmations

    services = tool_services
    confirmations = Confirmations(services)
    proposed = confirmations.propose("h" * 64, "demo", "book_meeting_room", {"start": "x"}, "订会议室", 1)
    first, second = confirmations.load(proposed.id), confirmations.load(proposed.id)
    assert first == second == proposed
    assert [confirmations.decide_once(first), confirmations.decide_once(second)] == [True, False]
    assert confirmations.load(proposed.id) is None and confirmations.latest_of("h" * 64) is None
