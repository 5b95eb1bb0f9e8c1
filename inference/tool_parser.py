"""A GLM-4.5+ reply's tool calls, parsed into OpenAI's ``tool_calls`` as the text streams in.

GLM-4.5/4.6 write ``<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>``
and GLM-4.7/GLM-5 the same without the newlines; both after their answer's text, if any, and
several in a row. Fed the answer (the think part already split off, ``inference.reasoning``),
``ToolCallParser`` gives back the content and the calls:

- text outside the calls is content, released as it comes; only what could still become
  ``<tool_call>`` (a tag split across deltas) and whitespace that may turn out to stand between
  the text and a call are held back;
- a call is released when its ``</tool_call>`` arrives, whole: its id and name in one
  ``ToolCallDelta``, its arguments (a JSON object) in the next ones, one argument each. A call
  is only known to be well formed once it is closed, and OpenAI's stream cannot take a call back;
- an argument's value is text the template wrote as it was when a string, as JSON otherwise;
  it is converted by the type its tool's JSON schema gives (a string stays text; an integer,
  number, boolean, array, object or null is read as JSON; a schema that allows several types
  takes the JSON value when it fits one of them, the text when one of them is a string; no type
  at all: JSON when the text is JSON, else the text);
- a malformed call (a name not among the tools, a value that is not JSON of its declared type,
  a key twice, stray text between the parts, a call never closed) is not a call: its text stays
  content, as the model wrote it.
"""

from __future__ import annotations

import json
import re

from inference.tool_calls import ToolCall, ToolCallDelta, ToolSpec, new_call_id

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
TOOL_TAGS = (CALL_OPEN, CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE)
_ARGUMENT = re.compile(re.escape(KEY_OPEN) + r"(.*?)" + re.escape(KEY_CLOSE) + r"\s*"
                       + re.escape(VALUE_OPEN) + r"(.*?)" + re.escape(VALUE_CLOSE) + r"\s*", re.DOTALL)
_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
               "object": (dict,), "array": (list,), "null": (type(None),)}


class MalformedCall(ValueError):
    """A ``<tool_call>`` whose body is not a call of one of the tools."""


class ToolCallParser:
    """``feed(text) -> (content, deltas)`` per piece of the answer, then ``finish()``.

    ``content`` and ``calls`` hold everything released so far.
    """

    def __init__(self, tools: tuple[ToolSpec, ...] | list[ToolSpec]):
        self.tools = {tool.name: tool for tool in tools}
        self.content = ""
        self.calls: list[ToolCall] = []
        self._held = ""  # text not yet released: a possible tag, whitespace, or an open call
        self._in_call = False
        self._after_call = False  # whitespace right after a call is not content
        self._gap = ""  # the whitespace before the open call
        self._finished = False

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        if self._finished:
            raise RuntimeError("feed after finish")
        self._held += text
        content, deltas = [], []
        while True:
            if self._in_call:
                end = self._held.find(CALL_CLOSE)
                if end < 0:
                    break
                body, self._held = self._held[:end], self._held[end + len(CALL_CLOSE):]
                self._in_call = False
                self._close_call(body, content, deltas)
                continue
            start = self._held.find(CALL_OPEN)
            if start < 0:
                keep = len(self._held) - _partial_suffix(self._held, CALL_OPEN)
                text, tag = self._text(self._held[:keep]), self._held[keep:]
                body = text.rstrip()
                content.append(body)
                self._held = text[len(body):] + tag
                break
            text = self._text(self._held[:start])
            content.append(text.rstrip())
            self._gap = text[len(text.rstrip()):]  # content again if the call is not one
            self._held, self._in_call = self._held[start + len(CALL_OPEN):], True
        return self._release(content), deltas

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """What was held back: an unclosed call's text, a partial tag, trailing whitespace (kept
        when the reply made no call)."""
        self._finished = True
        held, self._held = self._held, ""
        if self._in_call:
            return self._release([self._gap + CALL_OPEN + held]), []
        text = self._text(held)
        return self._release([text.rstrip() if self.calls else text]), []

    def _text(self, text: str) -> str:
        """Text outside the calls; whitespace right after a call is not content."""
        if self._after_call:
            text = text.lstrip()
            if text:
                self._after_call = False
        return text

    def _close_call(self, body: str, content: list[str], deltas: list[ToolCallDelta]) -> None:
        try:
            name, arguments = parse_call(body, self.tools)
        except MalformedCall:
            content.append(self._gap + CALL_OPEN + body + CALL_CLOSE)
            return
        call = ToolCall(new_call_id(), name, json.dumps(arguments, ensure_ascii=False))
        index = len(self.calls)
        self.calls.append(call)
        self._after_call = True
        deltas.append(ToolCallDelta(index, call.id, call.name, ""))
        deltas += [ToolCallDelta(index, arguments=piece) for piece in argument_pieces(arguments)]

    def _release(self, content: list[str]) -> str:
        text = "".join(content)
        self.content += text
        return text


def parse_tool_calls(text: str, tools: tuple[ToolSpec, ...] | list[ToolSpec]) -> tuple[str, list[ToolCall]]:
    """A whole answer as (content, calls)."""
    parser = ToolCallParser(tools)
    parser.feed(text)
    parser.finish()
    return parser.content, parser.calls


def parse_call(body: str, tools: dict[str, ToolSpec]) -> tuple[str, dict]:
    """The text between ``<tool_call>`` and ``</tool_call>`` as (name, arguments)."""
    name_end = body.find(KEY_OPEN)
    name = (body if name_end < 0 else body[:name_end]).strip()
    tool = tools.get(name)
    if tool is None:
        raise MalformedCall(f"no tool named {name!r}")
    arguments: dict = {}
    position = len(body) if name_end < 0 else name_end
    while position < len(body):
        found = _ARGUMENT.match(body, position)
        if found is None:
            raise MalformedCall("stray text between the arguments")
        key, raw = found.group(1).strip(), found.group(2)
        if not key or key in arguments or any(tag in key or tag in raw for tag in TOOL_TAGS):
            raise MalformedCall(f"argument {key!r} is empty, repeated or holds a tag")
        arguments[key] = argument_value(raw, tool.parameter(key))
        position = found.end()
    return name, arguments


def argument_value(raw: str, schema: dict | None):
    """An ``<arg_value>``'s text as the value its JSON schema's type says; raises
    ``MalformedCall`` for a value of a declared type it is not."""
    types = schema_types(schema)
    if types == {"string"}:
        return raw
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        if not types or "string" in types:
            return raw
        raise MalformedCall(f"{raw[:40]!r} is not JSON of type {sorted(types)}") from None
    if not types or _is_a(value, types):
        return value
    if "string" in types:
        return raw
    raise MalformedCall(f"{raw[:40]!r} is not of type {sorted(types)}")


def schema_types(schema: dict | None) -> set[str]:
    """The JSON types a schema allows (``type``, or ``anyOf``/``oneOf``'s, or its ``enum``'s);
    empty when it says none."""
    if not isinstance(schema, dict):
        return set()
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared} if declared in _JSON_TYPES else set()
    if isinstance(declared, list):
        return {t for t in declared if t in _JSON_TYPES}
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            found = set()
            for option in schema[key]:
                types = schema_types(option)
                if not types:
                    return set()  # one option takes anything
                found |= types
            return found
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return {_type_of(v) for v in schema["enum"]}
    return set()


def argument_pieces(arguments: dict) -> list[str]:
    """``json.dumps(arguments)`` in pieces of one argument each, for a stream."""
    if not arguments:
        return ["{}"]
    pieces = [json.dumps(k, ensure_ascii=False) + ": " + json.dumps(v, ensure_ascii=False)
              for k, v in arguments.items()]
    return ["{" + pieces[0], *(", " + p for p in pieces[1:]), "}"]


def _is_a(value, types: set[str]) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    return any(isinstance(value, _JSON_TYPES[t]) for t in types)


def _type_of(value) -> str:
    for name in ("boolean", "integer", "number", "string", "object", "array", "null"):
        if _is_a(value, {name}):
            return name
    return "string"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
