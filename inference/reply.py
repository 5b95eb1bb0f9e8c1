"""What a chat request's tools mean for the bundled engine, and its reply read back: the one
place the model server (``inference/server/serve.py``) and the worker's engine backend
(``app/llm/engine_backend.py``) share, so both answer a request with tools the same way.

OpenAI's ``tool_choice``, on a GLM-4.5+ model (``tool_use``):

- ``none``: the prompt shows no tools and the reply is read as text;
- ``auto``: the prompt shows the tools; the reply's calls, if it makes any, are parsed;
- ``required``: as ``auto``, and decoding is held to the call format until a call of one of the
  tools is written (more may follow), ``inference.engine.tool_constraint``;
- a named function: the prompt shows every tool (as OpenAI's and vLLM's do), and the reply is one
  call of that function.

``ReplyReader`` splits a reply as it streams: its think part (``inference.reasoning``), then
the answer's text and its calls (``inference.tool_parser``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.reasoning import ReasoningSplitter
from inference.tokenizer import ChatTokenizer
from inference.tool_calls import ForcedToolCall, ToolCall, ToolCallDelta, ToolChoice, ToolSpec
from inference.tool_parser import ToolCallParser


@dataclass(frozen=True)
class ToolUse:
    """``shown``: the tools the prompt lists (OpenAI's dicts); ``forced``: the engine's
    constraint (None: free); ``read``: the tools a reply's calls are parsed against."""

    shown: list[dict] = field(default_factory=list)
    forced: ForcedToolCall | None = None
    read: tuple[ToolSpec, ...] = ()


def tool_use(tokenizer: ChatTokenizer, tools: tuple[ToolSpec, ...], choice: ToolChoice,
             enable_thinking: bool = True) -> ToolUse:
    """Raises ValueError where the model cannot take them (a GLM-4 chat format; a forced call
    without the tool-call tags as tokens)."""
    if not tools or choice.mode == "none":
        return ToolUse()
    if not tokenizer.thinking:
        raise ValueError("tools need a GLM-4.5 or later chat format; this model's (GLM-4) has none")
    forced = None
    if choice.forces_call:
        if not tokenizer.has_tool_tokens:
            raise ValueError("tool_choice 'required' or a named function needs the tool-call tags as tokens")
        named = choice.mode == "function"
        forced = ForcedToolCall(tuple(t for t in tools if not named or t.name == choice.name), once=named,
                                think_first=tokenizer.reply_starts_thinking(enable_thinking),
                                may_think=tokenizer.layout == "glm45" and enable_thinking)
    return ToolUse([t.openai for t in tools], forced, tools)


@dataclass
class ReplyDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class ReplyReader:
    """``feed(text) -> ReplyDelta`` per piece of the engine's text, then ``finish()``."""

    def __init__(self, tokenizer: ChatTokenizer | None, enable_thinking: bool = True,
                 tools: tuple[ToolSpec, ...] = ()):
        self.splitter = None
        if tokenizer is not None and tokenizer.thinking:
            start = "thinking" if tokenizer.reply_starts_thinking(enable_thinking) else "answer"
            self.splitter = ReasoningSplitter(start)
        self.parser = ToolCallParser(tools) if tools else None
        self.reasoning = ""
        self.content = ""

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.parser.calls if self.parser is not None else []

    def feed(self, text: str) -> ReplyDelta:
        reasoning, answer = self.splitter.feed(text) if self.splitter else ("", text)
        return self._read(reasoning, answer, final=False)

    def finish(self) -> ReplyDelta:
        reasoning, answer = self.splitter.finish() if self.splitter else ("", "")
        return self._read(reasoning, answer, final=True)

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """OpenAI's: "tool_calls" when the reply ended after making calls."""
        return "tool_calls" if self.tool_calls and engine_reason == "stop" else engine_reason

    def _read(self, reasoning: str, answer: str, final: bool) -> ReplyDelta:
        delta = ReplyDelta(reasoning, answer)
        if self.parser is not None:
            delta.content, delta.tool_calls = self.parser.feed(answer) if answer else ("", [])
            if final:
                tail, more = self.parser.finish()
                delta.content += tail
                delta.tool_calls += more
        self.reasoning += delta.reasoning
        self.content += delta.content
        return delta
