"""The worker's engine backend with tools (``app/llm/tools.py``), on a tiny random GLM-4.5-style
checkpoint: a forced call comes back in ``Generation.tool_calls`` and as ``ToolCallDelta``s, and
the conversation goes on with the call and its result in OpenAI's messages."""

from __future__ import annotations

import json

import pytest

from app.llm import GenerationParams
from app.llm.engine_backend import EngineBackend
from app.llm.tools import ToolChoice, check_tools
from inference.engine import EngineArgs, LLMEngine
from inference.engine.service import EngineService
from tests.support.tool_model import write_tool_model

TOOLS = check_tools([
    {"type": "function", "function": {"name": "leave_balance", "parameters": {
        "type": "object", "properties": {"kind": {"enum": ["年假", "病假"]}}, "required": ["kind"]}}},
    {"type": "function", "function": {"name": "now"}}])
ASK = [{"role": "user", "content": "我还有几天年假"}]


@pytest.fixture(scope="module", params=["glm45", "glm47"])
def backend(request, tmp_path_factory):
    path = write_tool_model(tmp_path_factory.mktemp(request.param) / "model", request.param)
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(path), max_num_seqs=4, max_model_len=2048))
    backend = EngineBackend(EngineService(engine), "tiny")
    yield backend
    backend.close()


def params(**kwargs) -> GenerationParams:
    kwargs.setdefault("max_tokens", 96)
    return GenerationParams(temperature=0, enable_thinking=False, tools=TOOLS, **kwargs)


def test_a_named_call_comes_back_whole_and_streamed(backend):
    generation = backend.generate(ASK, params(tool_choice=ToolChoice("function", "leave_balance")))
    [call] = generation.tool_calls
    assert generation.finish_reason == "tool_calls" and generation.text == ""
    assert call.name == "leave_balance" and call.parsed_arguments()["kind"] in ("年假", "病假")
    pieces = [d for piece in backend.stream(ASK, params(tool_choice=ToolChoice("function", "leave_balance")))
              for d in piece.tool_calls]
    assert pieces[0].name == "leave_balance" and pieces[0].id
    assert "".join(p.arguments for p in pieces) == call.arguments


def test_the_loop_goes_on_with_the_result(backend):
    tokenizer = backend.service.engine.tokenizer
    call = backend.generate(ASK, params(tool_choice=ToolChoice("function", "now"))).tool_calls[0]
    loop = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call.as_openai()]},
            {"role": "tool", "tool_call_id": call.id, "content": "14:00"}]
    answer = backend.generate(loop, GenerationParams(max_tokens=4, temperature=0, enable_thinking=False,
                                                     tools=TOOLS))
    assert answer.prompt_tokens == len(tokenizer.apply_chat_template(
        loop, enable_thinking=False, tools=[t.openai for t in TOOLS]))
    assert json.loads(call.arguments) == {}


def test_tool_choice_none_shows_no_tools(backend):
    plain = backend.generate(ASK, GenerationParams(max_tokens=1, enable_thinking=False))
    none = backend.generate(ASK, params(max_tokens=1, tool_choice=ToolChoice("none")))
    assert none.prompt_tokens == plain.prompt_tokens and none.tool_calls == []
