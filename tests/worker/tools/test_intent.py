"""The demo's keyword planner: only offered tools, and the times it reads."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from app.tools.catalog import OfferedTool
from app.tools.registry import Server
from worker.tools.intent import route, when

SERVER = Server(1, "demo", "http", "http://x/mcp")
NOW = datetime(2026, 12, 7, 9, 30, tzinfo=ZoneInfo("Asia/Shanghai"))


def offered(*names):
    return [OfferedTool(SERVER, n, "", {"type": "object"}, n == "book_meeting_room") for n in names]


def test_routes_only_to_offered_tools():
    tools = offered("leave_balance", "book_meeting_room", "expense_claim_status")
    assert route("我还有几天年假", tools, now=NOW)[0].tool == "leave_balance"
    assert route("我的报销 EX-1234 到哪了", tools, now=NOW)[1] == {"claim_id": "EX-1234"}
    tool, args = route("帮我订明天下午两点的会议室", tools, now=NOW)
    assert tool.tool == "book_meeting_room" and args == {"start": "2026-12-08T14:00+08:00", "duration_minutes": 60}
    assert route("我还有几天年假", offered("book_meeting_room"), now=NOW) is None
    assert route("今天食堂吃什么", tools, now=NOW) is None
    assert route("帮我订个会议室", tools, now=NOW) is None  # no time: nothing guessed


def test_times():
    assert when("后天上午十点半", NOW) == datetime(2026, 12, 9, 10, 30, tzinfo=NOW.tzinfo)
    assert when("今天 15:45", NOW) == datetime(2026, 12, 7, 15, 45, tzinfo=NOW.tzinfo)
    assert when("明天晚上八点", NOW).hour == 20 and when("下午十二点", NOW).hour == 12
    assert when("明天", NOW) is None and when("25点", NOW) is None


def test_a_tool_the_model_interface_would_refuse_is_left_out():
    from app.llm.tools import check_tools
    from app.tools.catalog import usable

    odd = [OfferedTool(SERVER, "get.weather", "", {"type": "object"}, False),  # '.' is no function name
           OfferedTool(SERVER, "x" * 70, "", {"type": "object"}, False),
           OfferedTool(SERVER, "x" * 80, "", {"type": "object"}, False),  # the same once cut to 64
           OfferedTool(SERVER, "schema", "", ["not", "an", "object"], False),
           *offered("leave_balance")]
    kept = usable(odd)
    assert [t.tool for t in kept] == ["x" * 70, "leave_balance"]
    assert len(check_tools([t.openai() for t in kept])) == 2  # what the loop then offers the model
    assert len(usable(offered(*(f"t{i}" for i in range(200))))) == 128


def test_a_policy_question_stays_with_the_knowledge_base():
    """Only a question about the asker's own balance or claim reaches a tool: found chatting in
    make run, "How many days of childcare leave do I get?" was answered with the leave balance."""
    tools = offered("leave_balance", "book_meeting_room", "expense_claim_status")
    for question in ("How many days of childcare leave do I get?", "我第一年能休几天假", "产假有多少天",
                     "How do I claim my travel expenses?", "报销流程是什么", "病假需要什么证明"):
        assert route(question, tools, now=NOW) is None, question
    for question in ("How many days of annual leave do I have left?", "我的年假余额是多少",
                     "我还能休几天假", "what's my leave balance"):
        assert route(question, tools, now=NOW)[0].tool == "leave_balance", question
    for question in ("我的报销到哪一步了", "what's the status of my expense claim?",
                     "where is my claim EX-20261201?"):
        assert route(question, tools, now=NOW)[0].tool == "expense_claim_status", question


def test_a_confirmation_reads_as_words_not_json():
    from worker.tools.loop import readable

    assert readable({"start": "2026-12-09T14:00+08:00", "duration_minutes": 60, "room": "A101"}) == \
        "start 2026-12-09 14:00，duration_minutes 60，room A101"
    assert readable({"attendees": ["lina", "zhangwei"]}) == 'attendees ["lina", "zhangwei"]'
    assert readable({}) == "（无参数）"
