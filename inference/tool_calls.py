"""Function calling, as OpenAI's chat completions API shapes it: the tools offered, the choice of
tool, the calls a reply makes, and the conversation turns that carry them.

One representation for everyone who handles tool calls: the model server (``inference/server/serve.py``),
the web tier's ``/v1`` and the worker (through ``app/llm``, which re-exports these names), so a
call parsed from the bundled engine's output and one sent by a remote OpenAI-compatible server
look the same:

- a tool is OpenAI's ``{"type": "function", "function": {"name", "description", "parameters"}}``
  (``ToolSpec`` keeps the dict as given: the chat template renders it as it came);
- ``tool_choice`` is ``"auto"``, ``"none"``, ``"required"`` or
  ``{"type": "function", "function": {"name": ...}}`` (``ToolChoice``);
- a call is ``ToolCall(id, name, arguments)``, ``arguments`` a JSON object as text (OpenAI's);
  streamed, a call arrives as ``ToolCallDelta``s: its id and name first, then pieces of its
  arguments, each with the call's ``index``;
- the turns are OpenAI's messages: an assistant turn with ``tool_calls`` (its ``content`` may be
  empty) and, after it, one ``{"role": "tool", "tool_call_id", "content"}`` per call.

``check_tools``, ``check_tool_choice`` and ``check_tool_turns`` refuse what OpenAI refuses, with
a ``ToolRequestError`` naming the field (the servers answer 400 with it).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

MAX_TOOLS = 128  # OpenAI's limit on `tools`
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
CHOICE_MODES = ("auto", "none", "required")


class ToolRequestError(ValueError):
    """A request's tools, tool choice or tool turns are not valid; ``param`` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call. ``openai`` is the tool as the client sent it."""

    name: str
    parameters: dict
    openai: dict = field(compare=False, repr=False)

    def parameter(self, key: str) -> dict | None:
        """The JSON schema of one argument, if the tool declares it."""
        properties = self.parameters.get("properties")
        schema = properties.get(key) if isinstance(properties, dict) else None
        return schema if isinstance(schema, dict) else None

    @property
    def required(self) -> list[str]:
        required = self.parameters.get("required")
        return [r for r in required if isinstance(r, str)] if isinstance(required, list) else []


@dataclass(frozen=True)
class ToolChoice:
    """``mode`` is "auto", "none", "required" or "function" (then ``name`` is the tool's)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def forces_call(self) -> bool:
        return self.mode in ("required", "function")

    def as_openai(self) -> str | dict:
        if self.mode == "function":
            return {"type": "function", "function": {"name": self.name}}
        return self.mode


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: ``arguments`` is a JSON object as text."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def parsed_arguments(self) -> dict:
        """The arguments as a dict ({} when they are not a JSON object: a remote model's slip)."""
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed call, as OpenAI's ``delta.tool_calls[i]``: the first piece of a call
    has its ``id`` and ``name``, the later ones pieces of its ``arguments``."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def as_openai(self) -> dict:
        out: dict = {"index": self.index}
        function: dict = {"arguments": self.arguments}
        if self.id is not None:
            out.update(id=self.id, type="function")
        if self.name is not None:
            function = {"name": self.name, "arguments": self.arguments}
        out["function"] = function
        return out


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ForcedToolCall:
    """A reply held to a tool call (``tool_choice`` "required" or a named function), for the
    engine (``SamplingParams.tool_call``, ``inference.engine.tool_constraint``): one of ``tools``
    is called, only once when ``once``. ``think_first``: the prompt opened a think part the
    reply closes before its call (GLM-4.7 with thinking on); ``may_think``: the reply may open
    one itself (GLM-4.5 with thinking on)."""

    tools: tuple[ToolSpec, ...]
    once: bool = False
    think_first: bool = False
    may_think: bool = False


# -- checking a request ------------------------------------------------------------------------


def check_tools(value) -> tuple[ToolSpec, ...]:
    """OpenAI's ``tools``: up to 128 functions with distinct names; ``parameters`` a JSON
    schema object (absent: no arguments)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise ToolRequestError(f"'tools' must be an array of at most {MAX_TOOLS} tools", "tools")
    specs, seen = [], set()
    for i, tool in enumerate(value):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ToolRequestError("a tool must be {'type': 'function', 'function': {...}}", param)
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ToolRequestError("a function's name must be 1 to 64 letters, digits, '_' or '-'",
                                   f"{param}.function.name")
        if name in seen:
            raise ToolRequestError(f"two tools are named {name!r}", f"{param}.function.name")
        seen.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise ToolRequestError("a function's description must be a string", f"{param}.function.description")
        parameters = function.get("parameters", {})
        if parameters is None:
            parameters = {}
        if not isinstance(parameters, dict):
            raise ToolRequestError("a function's parameters must be a JSON schema object",
                                   f"{param}.function.parameters")
        specs.append(ToolSpec(name, parameters, tool))
    return tuple(specs)


def check_tool_choice(value, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    """OpenAI's ``tool_choice``; without tools only "none" (or nothing) makes sense."""
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(value, str):
        if value not in CHOICE_MODES:
            raise ToolRequestError("'tool_choice' must be 'auto', 'none', 'required' or a named function",
                                   "tool_choice")
        if value != "none" and not tools:
            raise ToolRequestError(f"'tool_choice' {value!r} needs 'tools'", "tool_choice")
        return ToolChoice(value)
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ToolRequestError("a named 'tool_choice' is {'type': 'function', 'function': {'name': ...}}",
                               "tool_choice")
    if name not in {t.name for t in tools}:
        raise ToolRequestError(f"'tool_choice' names {name!r}, which is not in 'tools'", "tool_choice")
    return ToolChoice("function", name)


def check_tool_turns(messages: list[dict]) -> list[dict]:
    """The conversation's tool turns, checked as OpenAI checks them; returns the messages with
    each assistant turn's ``tool_calls`` in OpenAI's shape (extra keys dropped) and each tool
    turn's ``tool_call_id`` (other keys are the caller's to check).

    An assistant turn's calls have distinct ids and arguments that are a JSON object as text;
    every tool turn answers a call of the assistant turn before it (tool turns in a row answer
    the same one), and every call is answered before the conversation goes on.
    """
    out, waiting, param_of = [], {}, {}
    for i, message in enumerate(messages):
        role = message.get("role")
        if role != "tool" and waiting:
            missing = next(iter(waiting))
            raise ToolRequestError(f"the tool call {missing!r} has no tool message answering it",
                                   f"{param_of[missing]}")
        message = dict(message)
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls is None or calls == []:
                message.pop("tool_calls", None)
            else:
                message["tool_calls"] = _calls(calls, i)
                waiting = {c["id"]: True for c in message["tool_calls"]}
                param_of = {c["id"]: f"messages[{i}].tool_calls" for c in message["tool_calls"]}
                answered: set[str] = set()
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ToolRequestError("a tool message needs the 'tool_call_id' it answers",
                                       f"messages[{i}].tool_call_id")
            previous = out[-1]["role"] if out else None
            if previous not in ("assistant", "tool") or (previous == "assistant" and not out[-1].get("tool_calls")):
                raise ToolRequestError("a tool message must answer the tool calls of the assistant message "
                                       "before it", f"messages[{i}].role")
            if call_id not in waiting:
                said = "already answered" if previous == "tool" and call_id in answered else "not among its calls"
                raise ToolRequestError(f"'tool_call_id' {call_id!r} is {said}", f"messages[{i}].tool_call_id")
            del waiting[call_id]
            answered.add(call_id)
        out.append(message)
    if waiting:
        missing = next(iter(waiting))
        raise ToolRequestError(f"the tool call {missing!r} has no tool message answering it", param_of[missing])
    return out


def _calls(calls, index: int) -> list[dict]:
    param = f"messages[{index}].tool_calls"
    if not isinstance(calls, list):
        raise ToolRequestError("'tool_calls' must be an array", param)
    out, ids = [], set()
    for j, call in enumerate(calls):
        where = f"{param}[{j}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function" \
                or not isinstance(call.get("function"), dict):
            raise ToolRequestError("a tool call is {'id', 'type': 'function', 'function': {'name', 'arguments'}}",
                                   where)
        call_id, function = call.get("id"), call["function"]
        if not isinstance(call_id, str) or not call_id:
            raise ToolRequestError("a tool call needs an 'id'", f"{where}.id")
        if call_id in ids:
            raise ToolRequestError(f"two tool calls have the id {call_id!r}", f"{where}.id")
        ids.add(call_id)
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            raise ToolRequestError("a tool call needs the function's 'name'", f"{where}.function.name")
        if not isinstance(arguments, str):
            raise ToolRequestError("'arguments' must be a JSON object encoded as a string",
                                   f"{where}.function.arguments")
        try:
            parsed = json.loads(arguments or "{}")
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, dict):
            raise ToolRequestError("'arguments' must be a JSON object encoded as a string",
                                   f"{where}.function.arguments")
        out.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return out
