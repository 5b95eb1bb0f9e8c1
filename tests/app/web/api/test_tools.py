"""Tools on the web tier's /v1, driven by the official ``openai`` client through gunicorn, with a
remote OpenAI-compatible model server (the test stand-in answers as a server with a tool parser):
the tools reach the server, its calls come back as it sent them, tool turns are checked, and
the tools count against budgets."""

from __future__ import annotations

import json

import openai
import pytest
from sqlalchemy import select

from app.accounting import set_budget, set_price
from app.models import AuditEvent, UsageRecord
from tests.support.api_server import MODEL

LEAVE = {"type": "function", "function": {
    "name": "leave_balance", "description": "查询年假余额",
    "parameters": {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]}}}
ROOM = {"type": "function", "function": {"name": "book_room", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "我还有几天年假"}]


def test_the_servers_call_comes_back_as_it_sent_it(api, key, client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[ROOM, LEAVE],
                                           tool_choice={"type": "function", "function": {"name": "leave_balance"}})
    assert api.model.last_body["tools"] == [ROOM, LEAVE]
    assert api.model.last_body["tool_choice"] == {"type": "function", "function": {"name": "leave_balance"}}
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_fake_") and call.function.name == "leave_balance"  # its id, untouched
    assert json.loads(call.function.arguments) == {"question": "我还有几天年假"}
    with api.db.session() as session:
        [usage] = session.scalars(select(UsageRecord).where(UsageRecord.api_key_id == key[0]))
        [event] = session.scalars(select(AuditEvent).where(AuditEvent.actor == f"api_key:{key[0]}"))
    # charged the larger of the server's count and the estimate, which holds the tools' bytes
    assert usage.prompt_tokens >= reply.usage.prompt_tokens > len(json.dumps([ROOM, LEAVE]))
    assert usage.prompt_tokens >= len(json.dumps([ROOM, LEAVE], ensure_ascii=False).encode())
    assert event.outcome == "ok" and "leave_balance" not in event.payload_enc  # sealed


def test_the_call_streams_as_the_server_sent_it(client):
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[LEAVE], stream=True)
    pieces, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            pieces += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert pieces[0].id.startswith("call_fake_") and pieces[0].function.name == "leave_balance"
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == {"question": "我还有几天年假"}
    assert finish == "tool_calls"


def test_a_tool_loop_reaches_the_answer(api, client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[LEAVE])
    call = first.choices[0].message.tool_calls[0]
    loop = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "年假余额 5 天"}]
    answer = client.chat.completions.create(model=MODEL, messages=loop, tools=[LEAVE])
    assert answer.choices[0].message.content == "工具结果: 年假余额 5 天"
    assert answer.choices[0].finish_reason == "stop"
    sent = api.model.last_body["messages"]
    assert sent[1]["tool_calls"][0]["id"] == call.id and sent[2] == loop[2]


def test_tool_choice_none_passes_through(api, client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[LEAVE], tool_choice="none")
    assert api.model.last_body["tool_choice"] == "none"
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].message.content


CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "leave_balance", "arguments": "{}"}}]}


@pytest.mark.parametrize("kwargs, param", [
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "c1", "content": "x"}]}, "messages[1].role"),
    ({"messages": [*ASK, CALLED, {"role": "tool", "tool_call_id": "nope", "content": "x"}]},
     "messages[2].tool_call_id"),
    ({"messages": [*ASK, CALLED, *ASK]}, "messages[1].tool_calls"),
    ({"messages": [*ASK, {**CALLED, "tool_calls": [{"id": "c1", "type": "function",
                                                    "function": {"name": "x", "arguments": "not json"}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "x"}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"tools": [LEAVE], "tool_choice": {"type": "function", "function": {"name": "book_room"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": "all of them"}, "tools"),
])
def test_bad_tool_requests_are_400_naming_the_field(api, client, kwargs, param):
    calls = api.model.calls
    kwargs.setdefault("messages", ASK)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, **kwargs)
    assert caught.value.param == param
    assert api.model.calls == calls  # refused before the model


def test_a_long_list_of_tools_counts_against_the_budget(api, key, client):
    """The tools are prompt: charged (at least their bytes, the estimate's bound), so a budget
    that holds many plain questions is used up by one question that sends a big tool list."""
    name, _ = key
    many = [{"type": "function", "function": {"name": f"tool_{i}", "description": "说明" * 200}} for i in range(40)]
    with api.db.transaction() as session:
        set_price(session, MODEL, "1000", "1000", "1000")  # per million: a plain question ~0.05
        set_budget(session, "api_key", name, "day", "1")
    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=16)
    client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=16, tools=many, tool_choice="none")
    with api.db.session() as session:
        rows = list(session.scalars(select(UsageRecord).where(UsageRecord.api_key_id == name)))
    assert rows[-1].prompt_tokens >= len(json.dumps(many, ensure_ascii=False).encode())
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=16)
