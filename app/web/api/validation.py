"""The chat completion request, checked: anything malformed is a 400 that names the field.

Tools as OpenAI takes them: ``tools``, ``tool_choice``, assistant turns with ``tool_calls`` and
``tool`` turns answering them, checked by ``app.llm.tools`` (``parallel_tool_calls`` is accepted
and has no effect: a reply may make several calls)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.llm import GenerationParams
from app.llm.tools import ToolRequestError, check_tool_choice, check_tool_turns, check_tools
from app.web.api.errors import invalid

ROLES = ("system", "user", "assistant", "tool")
MAX_MESSAGES = 256
MAX_STOP = 4
MAX_CHOICES = 64  # guided_choice: replies to choose among (the inference server's limit)
MAX_CHOICE_CHARS = 8192


@dataclass
class ChatRequest:
    model: str
    messages: list[dict]
    params: GenerationParams
    stream: bool
    include_usage: bool

    @property
    def tools(self) -> list[dict]:
        """The tools offered, as the client sent them (prompt too: budgets count them)."""
        return [tool.openai for tool in self.params.tools]


def _content(value, index: int) -> str:
    """A string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts (text only)."""
    param = f"messages[{index}].content"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise invalid("only text content parts are supported", param)
            parts.append(part["text"])
        return "".join(parts)
    raise invalid("content must be a string or a list of text parts", param)


def _messages(value) -> list[dict]:
    if value is None:
        raise invalid("'messages' is required", "messages")
    if not isinstance(value, list) or not value:
        raise invalid("'messages' must be a non-empty array", "messages")
    if len(value) > MAX_MESSAGES:
        raise invalid(f"at most {MAX_MESSAGES} messages", "messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise invalid("each message must be an object", f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"role must be one of {', '.join(ROLES)}", f"messages[{i}].role")
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""  # an assistant turn that only called tools; we keep its place
        turn = {"role": role, "content": _content(content, i)}
        if role == "assistant" and message.get("tool_calls") is not None:
            turn["tool_calls"] = message["tool_calls"]
        if role == "tool":
            turn["tool_call_id"] = message.get("tool_call_id")
        out.append(turn)
    try:
        return check_tool_turns(out)
    except ToolRequestError as exc:
        raise invalid(str(exc), exc.param) from None


def _number(body: dict, name: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise invalid(f"'{name}' must be a number in {bracket}{low}, {high}]", name)
    return float(value)


def _integer(body: dict, name: str, default, low: int, high: int):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"'{name}' must be an integer in [{low}, {high}]", name)
    return value


def _stop(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) > MAX_STOP \
            or not all(isinstance(s, str) and s for s in value):
        raise invalid(f"'stop' must be a string or up to {MAX_STOP} non-empty strings", "stop")
    return tuple(value)


def _guided_choice(value) -> tuple[str, ...]:
    """vLLM's ``guided_choice``: the reply is one of these texts (the bundled engine's
    ``SamplingParams.choice``; a remote vLLM or SGLang server takes it as it is)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_CHOICES or not all(
            isinstance(c, str) and c.strip() and len(c) <= MAX_CHOICE_CHARS for c in value):
        raise invalid(f"'guided_choice' must be 1 to {MAX_CHOICES} non-empty strings of at most "
                      f"{MAX_CHOICE_CHARS} characters", "guided_choice")
    return tuple(value)


def _choice_scoring(value) -> str:
    """How the reply is chosen among ``guided_choice`` (the bundled engine's; vLLM's is "tokens")."""
    if value is None:
        return "tokens"
    if value not in ("tokens", "likelihood"):
        raise invalid("'choice_scoring' must be 'tokens' or 'likelihood'", "choice_scoring")
    return value


def _choice_bias(value, choices: tuple[str, ...], scoring: str) -> tuple[float, ...]:
    """With ``choice_scoring: likelihood``: one number per choice, added to its score."""
    if value is None:
        return ()
    if scoring != "likelihood":
        raise invalid("'choice_bias' needs 'choice_scoring': 'likelihood'", "choice_bias")
    if not isinstance(value, list) or len(value) != len(choices) or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in value):
        raise invalid("'choice_bias' must be one finite number per 'guided_choice' text", "choice_bias")
    return tuple(float(b) for b in value)


def _enable_thinking(value) -> bool | None:
    """``chat_template_kwargs.enable_thinking`` (vLLM's convention); other keys are ignored."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    thinking = value.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise invalid("'enable_thinking' must be a boolean", "chat_template_kwargs.enable_thinking")
    return thinking


def parse_chat_request(body, default_max_tokens: int, max_tokens_cap: int,
                       defaults: GenerationParams) -> ChatRequest:
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required", "model")
    messages = _messages(body.get("messages"))
    try:
        tools = check_tools(body.get("tools"))
        tool_choice = check_tool_choice(body.get("tool_choice"), tools)
    except ToolRequestError as exc:
        raise invalid(str(exc), exc.param) from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options")
    if _integer(body, "n", 1, 1, 1) != 1:
        raise invalid("only n=1 is supported", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _integer({"max_tokens": max_tokens}, "max_tokens", default_max_tokens, 1,
                          max_tokens_cap)
    params = GenerationParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", defaults.temperature, 0.0, 2.0),
        top_p=_number(body, "top_p", defaults.top_p, 0.0, 1.0, low_open=True),
        stop=_stop(body.get("stop")),
        seed=_integer(body, "seed", None, -(2**63), 2**63 - 1),
        enable_thinking=_enable_thinking(body.get("chat_template_kwargs")),
        choice=(choice := _guided_choice(body.get("guided_choice"))),
        choice_scoring=(scoring := _choice_scoring(body.get("choice_scoring"))),
        choice_bias=_choice_bias(body.get("choice_bias"), choice, scoring),
        tools=tools,
        tool_choice=tool_choice,
    )
    return ChatRequest(model, messages, params, stream, bool(options.get("include_usage")))
