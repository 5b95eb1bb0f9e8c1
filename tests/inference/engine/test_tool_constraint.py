"""Decoding held to a tool call (``SamplingParams.tool_call``) on a tiny random GLM-4.5-style
model: whatever the random weights prefer, the reply is a well-formed call of an offered tool,
in GLM-4.5's and GLM-4.7's format, with its keys and listed values from the tool's schema."""

from __future__ import annotations

import json

import pytest
import torch

from inference.engine import EngineArgs, LLMEngine
from inference.engine.choices import AnyBut, mask_to_allowed
from inference.engine.tool_constraint import ToolCallConstraint
from inference.sampling_params import SamplingParams
from inference.tool_calls import ForcedToolCall, check_tools
from inference.tool_parser import parse_tool_calls
from tests.support.tool_model import write_tool_model

TOOLS = check_tools([
    {"type": "function", "function": {"name": "book_room", "parameters": {"type": "object", "properties": {
        "room": {"enum": ["A", "B 会议室"]}, "video": {"type": "boolean"}, "seats": {"const": 8}},
        "required": ["room"]}}},
    {"type": "function", "function": {"name": "now"}},
    {"type": "function", "function": {"name": "note", "parameters": {"type": "object", "properties": {
        "text": {"type": "string"}}, "required": ["text"]}}},
])
ASK = [{"role": "user", "content": "订会议室"}]


@pytest.fixture(scope="module", params=["glm45", "glm47"])
def engine(request, tmp_path_factory):
    path = write_tool_model(tmp_path_factory.mktemp(request.param) / "model", request.param)
    return LLMEngine.from_engine_args(EngineArgs(model=str(path), max_num_seqs=8, max_model_len=2048))


def run(engine, forced: ForcedToolCall, seed: int, thinking: bool = False, max_tokens: int = 120):
    prompt = engine.tokenizer.apply_chat_template(ASK, enable_thinking=thinking, tools=[t.openai for t in TOOLS])
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, tool_call=forced)
    return engine.generate([prompt], params)[0]


@pytest.mark.parametrize("seed", range(6))
def test_sampled_freely_the_reply_is_still_one_call_of_the_named_tool(engine, seed):
    out = run(engine, ForcedToolCall(TOOLS[:1], once=True), seed)
    content, calls = parse_tool_calls(engine.tokenizer.decode(out.token_ids), TOOLS)
    assert out.finish_reason == "stop" and content == ""
    [call] = calls
    arguments = json.loads(call.arguments)
    assert call.name == "book_room" and arguments["room"] in ("A", "B 会议室")
    assert set(arguments) <= {"room", "video", "seats"} and arguments.get("seats", 8) == 8
    assert out.token_ids[-1] in engine.eos_token_ids


@pytest.mark.parametrize("seed", range(4))
def test_required_makes_calls_of_the_offered_tools_only(engine, seed):
    out = run(engine, ForcedToolCall(TOOLS[:2]), seed, max_tokens=300)
    _, calls = parse_tool_calls(engine.tokenizer.decode(out.token_ids), TOOLS)
    assert calls and {c.name for c in calls} <= {"book_room", "now"}


def test_a_free_value_ends_at_its_tag_and_holds_no_other(engine):
    """A string value is the model's own text: no tag and no end of reply inside it."""
    out = run(engine, ForcedToolCall(TOOLS[2:], once=True), seed=3, max_tokens=40)
    text = engine.tokenizer.decode(out.token_ids, skip_special_tokens=False)
    opening = "<arg_key>text</arg_key>" + ("\n" if engine.tokenizer.layout == "glm45" else "") + "<arg_value>"
    assert opening in text
    value = text.split(opening, 1)[1]
    assert "<tool_call>" not in value and "<arg_key>" not in value and "<|endoftext|>" not in value


def test_a_think_part_comes_first_where_the_prompt_opened_it(engine):
    tok = engine.tokenizer
    forced = ForcedToolCall(TOOLS[:1], once=True, think_first=tok.reply_starts_thinking(True),
                            may_think=tok.layout == "glm45")
    constraint = ToolCallConstraint(tok, forced, sorted(engine.eos_token_ids))
    think_close, call = tok.tokenizer.token_to_id("</think>"), tok.tokenizer.token_to_id("<tool_call>")
    first = constraint.allowed([])
    if tok.layout == "glm47":  # free reasoning, up to </think>; no call inside it
        assert isinstance(first, AnyBut) and call in first and think_close not in first
        written = tok.encode("想一想") + [think_close]
        forced = constraint.rest(written)  # the call and the one tool's name, written at once
        assert forced[: 1 + len(tok.encode("book_room"))] == [call, *tok.encode("book_room")]
    else:  # GLM-4.5: "\n" then <think> or <tool_call>
        assert first == tok.encode("\n")
        assert sorted(constraint.allowed(first)) == sorted([tok.tokenizer.token_to_id("<think>"), call])


def test_the_mask_keeps_a_list_or_drops_a_few():
    logits = torch.zeros(3, 5)
    masked = mask_to_allowed(logits, [[1, 3], AnyBut([0, 4]), None])
    assert torch.isinf(masked[0]).tolist() == [True, False, True, False, True]
    assert torch.isinf(masked[1]).tolist() == [True, False, False, False, True]
    assert not torch.isinf(masked[2]).any()


def test_without_the_tags_as_tokens_a_call_cannot_be_forced(tmp_path):
    from tokenizers import AddedToken

    from inference.tokenizer import ChatTokenizer, build_glm_tokenizer, save_glm_tokenizer
    tokenizer = build_glm_tokenizer(["hello world"] * 20, vocab_size=300)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<think>", "</think>")])
    save_glm_tokenizer(tokenizer, tmp_path)
    with pytest.raises(ValueError, match="tool-call tags"):
        ToolCallConstraint(ChatTokenizer.from_pretrained(tmp_path), ForcedToolCall(TOOLS[:1]), [0])


def test_a_forced_call_is_not_a_choice():
    with pytest.raises(ValueError, match="forced tool call"):
        SamplingParams(choice=["a"], tool_call=ForcedToolCall(TOOLS[:1]))
