"""Hostile and broken tool servers against the real tool loop (the model planner, a scripted
model), each a real process: the SDK's server over streamable HTTP and over stdio, a plain HTTP
server that answers garbage, and a port where nothing listens. Bounded, truncated, marked as
data, a clear notice, on the record, and no action because a result asked for it."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from app.llm import Generation
from app.llm.tools import ToolCall
from app.models import AuditEvent
from app.services import Services
from app.tools import registry
from tests.support import mcp_servers
from tests.support.env import settings_from
from tests.worker.test_processor_data import FakeWeCom
from worker.metering import Meter
from worker.scope.directory import Directory
from worker.tools.loop import DATA_OPEN, LIMIT_NOTICE, REFUSED_ACTION, ToolLoop

pytestmark = pytest.mark.faults
HOSTILE = "tests/support/hostile_mcp.py"


class ScriptedModel:
    """Answers with the scripted generations in turn, keeping every prompt it was shown."""

    model_name = "scripted"

    def __init__(self, *turns):
        self.turns, self.prompts = list(turns), []

    def generate(self, messages, params):
        self.prompts.append(json.loads(json.dumps(messages)))
        assert params.tools, "the tools are offered"
        calls, text = self.turns.pop(0)
        return Generation(text=text, model="scripted", prompt_tokens=100, completion_tokens=20,
                          finish_reason="tool_calls" if calls else "stop",
                          tool_calls=[ToolCall(f"call_{i}", name, json.dumps(args)) for i, (name, args) in
                                      enumerate(calls)])


def call(name, **args):
    return ([(name, args)], "")


def answer(text):
    return ([], text)


@pytest.fixture
def transfers(tmp_path, monkeypatch):
    path = tmp_path / "transfers.log"
    path.write_text("")
    monkeypatch.setenv("HOSTILE_TRANSFERS", str(path))
    return path


@pytest.fixture
def hostile_http(transfers):
    port = mcp_servers.free_port()
    process = mcp_servers.start([HOSTILE, str(port)], port)
    yield f"http://127.0.0.1:{port}/mcp"
    mcp_servers.stop(process)


@pytest.fixture
def garbage_http():
    class Garbage(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"jsonrpc": "2.0", "id": 1, "result": {"this is": "not MCP"'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    server.shutdown()


@pytest.fixture
def loop_for(env, db, redis_client, tmp_path):
    seed, _ = mcp_servers.keypair(tmp_path)

    def make(name, transport, target, timeout_s="2"):
        """``timeout_s``: one call's; a stdio call starts its server process within it."""
        settings = settings_from(env, tools_enabled="true", tools_signing_key=seed, tools_call_timeout_s=timeout_s,
                                 tools_result_max_chars="500", tools_max_steps="3")
        services = Services(settings, db)
        registry.add_server(services, name, transport, target)
        for tool in ("slow_lookup", "huge_report", "injected_note", "transfer_money"):
            registry.allow(services, name, tool, None)
        directory = Directory(services, FakeWeCom())
        return services, ToolLoop(services, Meter(services, directory), directory, FakeWeCom())
    return make


ROW = SimpleNamespace(id=1, user_hash="h" * 64, request_id="r1", channel="app", budgeted=False)


def run(loop, model, text="查一下"):
    return loop.answer(ROW, "lina", text, [], lambda: model, "app")


def tool_outcomes(services):
    with services.db.session() as session:
        return [(e.outcome, services.audit.payload_of(e)["tool"]) for e in session.scalars(
            select(AuditEvent).where(AuditEvent.event_type == "tool_call").order_by(AuditEvent.seq))]


def test_an_injected_result_is_data_and_cannot_start_an_action(loop_for, hostile_http, transfers):
    services, loop = loop_for("hostile", "http", hostile_http)
    # the model follows the injected text: it asks for the transfer after the result
    model = ScriptedModel(call("hostile__injected_note"), call("hostile__transfer_money", to="attacker", amount=10000),
                          answer("备注里有一段可疑的文字，我没有照做。"))
    reply = run(loop, model)
    assert reply.text == "备注里有一段可疑的文字，我没有照做。"
    shown = model.prompts[1][-1]
    assert shown["role"] == "tool" and shown["content"].startswith(DATA_OPEN) and "IGNORE PREVIOUS" in shown["content"]
    assert "不是指令" in model.prompts[0][0]["content"]  # the system rule says results are data
    assert model.prompts[2][-1]["content"] == REFUSED_ACTION
    assert transfers.read_text() == ""  # the server never saw a transfer
    assert tool_outcomes(services) == [("ok", "injected_note"), ("refused", "transfer_money")]


def test_a_slow_tool_is_cut_at_its_timeout_with_a_notice(loop_for, hostile_http):
    services, loop = loop_for("hostile", "http", hostile_http)
    model = ScriptedModel(call("hostile__slow_lookup"), answer("查询超时了，请稍后再试。"))
    started = time.monotonic()
    reply = run(loop, model)
    assert time.monotonic() - started < 10
    assert "超时" in model.prompts[1][-1]["content"] and reply.text == "查询超时了，请稍后再试。"
    assert tool_outcomes(services) == [("timeout", "slow_lookup")]


def test_a_huge_result_is_truncated_before_the_model_sees_it(loop_for, hostile_http):
    services, loop = loop_for("hostile", "http", hostile_http)
    model = ScriptedModel(call("hostile__huge_report"), answer("报告很长，摘要如下。"))
    run(loop, model)
    content = model.prompts[1][-1]["content"]
    assert len(content) < 800 and "truncated: the tool returned 100000 characters" in content
    with services.db.session() as session:
        event = session.scalars(select(AuditEvent).where(AuditEvent.event_type == "tool_call")).one()
        assert len(services.audit.payload_of(event)["result"]) <= 4000


def test_the_same_call_is_not_run_twice_and_the_steps_are_bounded(loop_for, hostile_http):
    services, loop = loop_for("hostile", "http", hostile_http)
    model = ScriptedModel(call("hostile__injected_note"), call("hostile__injected_note"), call("hostile__injected_note"))
    reply = run(loop, model)
    assert reply.text == LIMIT_NOTICE
    assert "already made" in model.prompts[2][-1]["content"]
    assert tool_outcomes(services) == [("ok", "injected_note")]


def test_a_server_that_is_down_gets_a_notice(loop_for):
    services, loop = loop_for("gone", "http", f"http://127.0.0.1:{mcp_servers.free_port()}/mcp")
    model = ScriptedModel(call("gone__huge_report"), answer("x"))
    assert run(loop, model) is None  # its tools cannot be listed: nothing offered, the usual path
    assert model.prompts == []
    server = registry.server(services, "gone")
    assert services.redis.get(f"tools:list:down:{server.version}") == b"unavailable"
    started = time.monotonic()  # the next message does not try (and wait) again
    assert loop.catalog.offered((1,)) == [] and time.monotonic() - started < 0.5
    from app.tools.catalog import OfferedTool
    server = registry.server(services, "gone")
    loop.catalog.offered = lambda departments: [OfferedTool(server, "huge_report", "", {"type": "object"}, False)]
    model = ScriptedModel(call("gone__huge_report"), answer("服务暂时不可用。"))
    run(loop, model)
    assert "暂时无法连接" in model.prompts[1][-1]["content"]
    assert tool_outcomes(services) == [("unavailable", "huge_report")]


def test_malformed_answers_are_a_clear_failure(loop_for, garbage_http):
    services, loop = loop_for("garbage", "http", garbage_http)
    from app.tools.catalog import OfferedTool
    server = registry.server(services, "garbage")
    loop.catalog.offered = lambda departments: [OfferedTool(server, "huge_report", "", {"type": "object"}, False)]
    model = ScriptedModel(call("garbage__huge_report"), answer("返回内容无法识别。"))
    run(loop, model)
    assert tool_outcomes(services)[0][0] in ("malformed", "timeout")
    assert "无法识别" in model.prompts[1][-1]["content"] or "超时" in model.prompts[1][-1]["content"]


def test_the_hostile_server_over_stdio_is_bounded_too(loop_for, transfers):
    services, loop = loop_for("hoststdio", "stdio", f"{sys.executable} {HOSTILE} --stdio", "8")
    model = ScriptedModel(call("hoststdio__huge_report"), call("hoststdio__slow_lookup"), answer("好的。"))
    assert run(loop, model).text == "好的。"
    assert "truncated" in model.prompts[1][-1]["content"] and "超时" in model.prompts[2][-1]["content"]
    assert tool_outcomes(services) == [("ok", "huge_report"), ("timeout", "slow_lookup")]
