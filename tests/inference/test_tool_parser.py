"""GLM tool calls parsed into OpenAI's ``tool_calls``: whole, streamed at every split point, and
what a malformed call becomes."""

from __future__ import annotations

import json
import random

import pytest

from inference.reasoning import ReasoningSplitter
from inference.tool_calls import ToolCallDelta, check_tools
from inference.tool_parser import ToolCallParser, argument_value, parse_tool_calls, schema_types

TOOLS = check_tools([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "when": {"type": ["string", "null"]}, "scale": {"type": "number"}, "tags": {"type": "array"},
        "filter": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}}},
    {"type": "function", "function": {"name": "fetch", "parameters": {"type": "object", "properties": {
        "url": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "now"}},
])
GLM45_REPLY = ("我查一下两个地方。\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n"
               "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>metric</arg_key>\n"
               "<arg_value>true</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[\"a\", 1]</arg_value>\n"
               "</tool_call>\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>  42 </arg_value>\n"
               "<arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n</tool_call>\n<tool_call>now\n</tool_call>")
GLM47_REPLY = ("<tool_call>fetch<arg_key>url</arg_key><arg_value>https://example.com/?q=<b>1</b></arg_value>"
               "</tool_call><tool_call>get_weather<arg_key>city</arg_key><arg_value>true</arg_value>"
               "<arg_key>when</arg_key><arg_value>null</arg_value><arg_key>filter</arg_key>"
               "<arg_value>{\"a\": {\"b\": [1, 2.5]}}</arg_value><arg_key>scale</arg_key>"
               "<arg_value>1e3</arg_value></tool_call>")


def test_a_glm45_reply_with_text_and_three_calls():
    content, calls = parse_tool_calls(GLM45_REPLY, TOOLS)
    assert content == "我查一下两个地方。"
    assert [c.name for c in calls] == ["get_weather", "search", "now"]
    assert json.loads(calls[0].arguments) == {"city": "北京", "days": 3, "metric": True, "tags": ["a", 1]}
    assert json.loads(calls[1].arguments) == {"query": "  42 ", "limit": 5}  # a string stays as written
    assert calls[2].arguments == "{}"
    assert len({c.id for c in calls}) == 3 and all(c.id.startswith("call_") for c in calls)
    assert calls[0].as_openai()["type"] == "function"


def test_a_glm47_reply_converts_by_the_schema():
    content, calls = parse_tool_calls(GLM47_REPLY, TOOLS)
    assert content == ""
    assert json.loads(calls[0].arguments) == {"url": "https://example.com/?q=<b>1</b>"}
    assert json.loads(calls[1].arguments) == {"city": "true", "when": None, "filter": {"a": {"b": [1, 2.5]}},
                                              "scale": 1000.0}


@pytest.mark.parametrize("raw, schema, value", [
    ("3", {"type": "integer"}, 3), ("3", {"type": "string"}, "3"), ("3", {"type": "number"}, 3),
    ("3.5", {"type": "number"}, 3.5), ("false", {"type": "boolean"}, False),
    ("null", {"type": ["string", "null"]}, None), ("nope", {"type": ["string", "null"]}, "nope"),
    ('"x"', {"type": "string"}, '"x"'), ('"x"', None, "x"), ("plain words", None, "plain words"),
    ("[1]", {}, [1]), ("7", {"enum": [1, 7]}, 7), ("b", {"enum": ["a", "b"]}, "b"),
    ("2", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 2),
])
def test_values_follow_the_schema_type(raw, schema, value):
    assert argument_value(raw, schema) == value


@pytest.mark.parametrize("raw, schema", [
    ("three", {"type": "integer"}), ("1.5", {"type": "integer"}), ("1", {"type": "boolean"}),
    ("{bad json", {"type": "object"}), ("[1]", {"type": "object"}), ("true", {"type": "number"}),
])
def test_a_value_not_of_its_type_is_refused(raw, schema):
    with pytest.raises(ValueError):
        argument_value(raw, schema)


def test_schema_types():
    assert schema_types({"type": "string"}) == {"string"}
    assert schema_types({"anyOf": [{"type": "integer"}, {}]}) == set()
    assert schema_types({"enum": ["a", 1, True]}) == {"string", "integer", "boolean"}
    assert schema_types({"type": "weird"}) == set()


@pytest.mark.parametrize("reply, content", [
    ("ask <tool_call>no_such_tool\n</tool_call>", "ask <tool_call>no_such_tool\n</tool_call>"),
    ("<tool_call>get_weather<arg_key>days</arg_key><arg_value>three</arg_value></tool_call>",
     "<tool_call>get_weather<arg_key>days</arg_key><arg_value>three</arg_value></tool_call>"),
    ("x \n<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京", "x \n<tool_call>get_weather<arg_key>city"
     "</arg_key><arg_value>北京"),
    ("<tool_call>now<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value>"
     "</tool_call>", None),
    ("<tool_call>now stray<arg_key>a</arg_key></tool_call>", None),
    ("<tool_call>now<arg_key>a</arg_key>oops<arg_value>1</arg_value></tool_call>", None),
    ("<tool_call>now<tool_call>now</tool_call>", None),
    ("a < b and <tool_c", "a < b and <tool_c"),
])
def test_a_malformed_call_stays_content(reply, content):
    text, calls = parse_tool_calls(reply, TOOLS)
    assert calls == [] and text == (reply if content is None else content)


def test_good_calls_around_a_bad_one_are_kept():
    reply = "<tool_call>now</tool_call><tool_call>nope</tool_call><tool_call>fetch<arg_key>url</arg_key>" \
            "<arg_value>u</arg_value></tool_call>"
    content, calls = parse_tool_calls(reply, TOOLS)
    assert [c.name for c in calls] == ["now", "fetch"] and content == "<tool_call>nope</tool_call>"


def test_text_without_calls_is_untouched():
    for text in ("plain answer \n\n", "  lead", "年假有十天。", ""):
        assert parse_tool_calls(text, TOOLS) == (text, [])


# -- streaming ---------------------------------------------------------------------------------


def streamed(text: str, cuts: list[int]) -> tuple[str, list[ToolCallDelta], list]:
    parser = ToolCallParser(TOOLS)
    content, deltas = [], []
    bounds = [0, *sorted(cuts), len(text)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        c, d = parser.feed(text[a:b])
        content.append(c)
        deltas += d
    c, d = parser.finish()
    return "".join(content) + c, deltas + d, parser.calls


def assembled(deltas: list[ToolCallDelta]) -> list[tuple[str, str, str]]:
    """The calls as an OpenAI client puts them together from the deltas."""
    calls: dict[int, list] = {}
    for delta in deltas:
        if delta.id is not None:
            assert delta.index not in calls and delta.name  # id and name come first, once
            calls[delta.index] = [delta.id, delta.name, delta.arguments]
        else:
            calls[delta.index][2] += delta.arguments
    return [tuple(calls[i]) for i in sorted(calls)]


SAMPLES = [GLM45_REPLY, GLM47_REPLY, "先说明一下 <b>粗体</b>\n\n<tool_call>now</tool_call>\n 然后 \n",
           "ask <tool_call>no_such_tool\n</tool_call> <tool_call>now\n</tool_call>",
           "x \n<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京"]


@pytest.mark.parametrize("sample", SAMPLES)
def test_a_stream_split_at_any_one_point_gives_the_whole_result(sample):
    content, calls = parse_tool_calls(sample, TOOLS)
    for cut in range(len(sample) + 1):
        text, deltas, stream_calls = streamed(sample, [cut])
        assert text == content, cut
        assert [(n, a) for _, n, a in assembled(deltas)] == [(c.name, c.arguments) for c in calls], cut
        assert [(i, n, a) for i, n, a in assembled(deltas)] == [(c.id, c.name, c.arguments) for c in stream_calls]


@pytest.mark.parametrize("seed", range(40))
def test_a_stream_split_at_random_points_gives_the_whole_result(seed):
    rng = random.Random(seed)
    sample = rng.choice(SAMPLES)
    content, calls = parse_tool_calls(sample, TOOLS)
    cuts = rng.sample(range(len(sample) + 1), rng.randint(1, min(40, len(sample))))
    text, deltas, _ = streamed(sample, cuts)
    assert text == content
    assert [(n, a) for _, n, a in assembled(deltas)] == [(c.name, c.arguments) for c in calls]


def test_a_stream_releases_text_early_and_holds_only_a_possible_tag():
    parser = ToolCallParser(TOOLS)
    assert parser.feed("我查一下") == ("我查一下", [])
    assert parser.feed("。\n<tool") == ("。", [])  # the newline could stand before a call
    assert parser.feed("_call>now") == ("", [])
    content, deltas = parser.feed("</tool_call>")
    assert content == "" and deltas[0].name == "now" and deltas[0].id and deltas[0].arguments == ""
    assert "".join(d.arguments for d in deltas) == "{}"
    assert parser.finish() == ("", [])


def test_arguments_come_one_piece_per_argument_after_the_name():
    _, deltas, calls = streamed(GLM45_REPLY, [])
    first = [d for d in deltas if d.index == 0]
    assert first[0].as_openai() == {"index": 0, "id": calls[0].id, "type": "function",
                                    "function": {"name": "get_weather", "arguments": ""}}
    assert [d.arguments for d in first[1:]] == ['{"city": "北京"', ', "days": 3', ', "metric": true',
                                                ', "tags": ["a", 1]', "}"]
    assert first[1].as_openai() == {"index": 0, "function": {"arguments": '{"city": "北京"'}}


def test_after_the_reasoning_split():
    """A reply's think part first (``inference.reasoning``), then its calls: a call inside the
    think part is reasoning, not a call."""
    reply = "<think>maybe <tool_call>now</tool_call>?</think>\n好的\n<tool_call>now\n</tool_call>"
    splitter, parser = ReasoningSplitter("answer"), ToolCallParser(TOOLS)
    reasoning, answer = splitter.feed(reply)
    more_reasoning, more_answer = splitter.finish()
    content, _ = parser.feed(answer + more_answer)
    tail, _ = parser.finish()
    assert reasoning + more_reasoning == "maybe <tool_call>now</tool_call>?"
    assert content + tail == "好的" and [c.name for c in parser.calls] == ["now"]
