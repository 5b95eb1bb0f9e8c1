"""`inference serve` with `tools`, driven by the official ``openai`` client over HTTP, on a tiny
random GLM-4.5-style checkpoint (``tests.support.tool_model``) in GLM-4.5's and GLM-4.7's
layouts. The model's own text is noise; a forced ``tool_choice`` holds it to the call format,
so the calls checked here are the engine's, parsed from what it wrote."""

from __future__ import annotations

import json

import openai
import pytest

from emulator.http_server import WSGIServer
from inference.engine import EngineArgs, LLMEngine
from inference.engine.service import EngineService
from inference.server.serve import create_app
from tests.support.tool_model import write_tool_model

BOOK = {"type": "function", "function": {
    "name": "book_room", "description": "订会议室",
    "parameters": {"type": "object", "properties": {
        "room": {"type": "string", "enum": ["A", "B 会议室"]}, "video": {"type": "boolean"},
        "seats": {"type": "integer", "enum": [4, 8]}}, "required": ["room", "seats"]}}}
NOW = {"type": "function", "function": {"name": "now", "description": "现在几点",
                                        "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "帮我订明天下午两点的会议室"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module", params=["glm45", "glm47"])
def server(request, tmp_path_factory):
    path = write_tool_model(tmp_path_factory.mktemp(request.param) / "model", request.param)
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(path), max_num_seqs=4, max_model_len=2048))
    service = EngineService(engine)
    http = WSGIServer(create_app(service, "tiny-glm", default_max_tokens=48), "127.0.0.1", 0, name="serve")
    http.start()
    yield http, engine.tokenizer
    http.stop()
    service.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(api_key="none", base_url=f"http://127.0.0.1:{server[0].port}/v1", max_retries=0,
                         timeout=60)


def ask(client, **kwargs):
    kwargs.setdefault("messages", ASK)
    return client.chat.completions.create(model="tiny-glm", temperature=0, max_tokens=kwargs.pop("max_tokens", 96),
                                          extra_body=NO_THINKING, **kwargs)


def test_a_named_function_is_called(client):
    reply = ask(client, tools=[BOOK, NOW], tool_choice={"type": "function", "function": {"name": "book_room"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "book_room" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    assert arguments["room"] in ("A", "B 会议室") and arguments["seats"] in (4, 8)
    assert set(arguments) <= {"room", "video", "seats"} and isinstance(arguments.get("video", True), bool)
    assert not choice.message.content


def test_required_calls_one_of_the_tools(client):
    reply = ask(client, tools=[NOW, BOOK], tool_choice="required")
    calls = reply.choices[0].message.tool_calls
    assert calls and all(c.function.name in ("now", "book_room") for c in calls)
    assert reply.choices[0].finish_reason in ("tool_calls", "length")


def test_the_stream_sends_the_call_as_openai_does(client):
    whole = ask(client, tools=[BOOK], tool_choice={"type": "function", "function": {"name": "book_room"}})
    stream = ask(client, tools=[BOOK], tool_choice={"type": "function", "function": {"name": "book_room"}},
                 stream=True, stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            pieces += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert pieces[0].id and pieces[0].function.name == "book_room" and pieces[0].type == "function"
    assert all(p.index == 0 and p.id is None for p in pieces[1:]) and len(pieces) > 2
    arguments = "".join(p.function.arguments or "" for p in pieces)
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments  # greedy: the same call
    assert finish == "tool_calls" and usage.completion_tokens == whole.usage.completion_tokens


def test_the_tools_are_in_the_prompt_and_counted(client, server):
    tokenizer = server[1]
    plain = ask(client, max_tokens=1)
    offered = ask(client, max_tokens=1, tools=[BOOK, NOW])
    none = ask(client, max_tokens=1, tools=[BOOK, NOW], tool_choice="none")
    shown = tokenizer.apply_chat_template(ASK, enable_thinking=False, tools=[BOOK, NOW])
    assert offered.usage.prompt_tokens == len(shown) > plain.usage.prompt_tokens + 100
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens  # "none" shows no tools


def test_a_tool_loop_goes_on_after_the_results(client, server):
    tokenizer = server[1]
    call = ask(client, tools=[BOOK, NOW], tool_choice={"type": "function", "function": {"name": "now"}})
    [made] = call.choices[0].message.tool_calls
    assert made.function.arguments == "{}"
    loop = [*ASK, call.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": made.id, "content": "2026-12-07 14:00"}]
    answer = ask(client, messages=loop, tools=[BOOK, NOW], max_tokens=4)
    expected = tokenizer.apply_chat_template(loop, enable_thinking=False, tools=[BOOK, NOW])
    assert answer.usage.prompt_tokens == len(expected)
    assert "2026-12-07 14:00" in tokenizer.decode(expected)


CALLED = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]}


@pytest.mark.parametrize("kwargs, param", [
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "c1", "content": "x"}]}, "messages[1].role"),
    ({"messages": [*ASK, CALLED, {"role": "tool", "tool_call_id": "c9", "content": "x"}]}, "messages[2].tool_call_id"),
    ({"messages": [*ASK, CALLED, {"role": "tool", "content": "x"}]}, "messages[2].tool_call_id"),
    ({"messages": [*ASK, CALLED, *ASK]}, "messages[1].tool_calls"),
    ({"messages": [*ASK, CALLED]}, "messages[1].tool_calls"),
    ({"messages": [*ASK, {**CALLED, "tool_calls": [{"id": "c1", "type": "function",
                                                    "function": {"name": "now", "arguments": "[1]"}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "x"}]}, "messages[1].tool_calls[0].function.arguments"),
    ({"tools": [NOW], "tool_choice": {"type": "function", "function": {"name": "book_room"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [NOW], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [NOW, NOW]}, "tools[1].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
])
def test_bad_tool_requests_are_400_naming_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, **kwargs)
    assert caught.value.status_code == 400 and caught.value.param == param
