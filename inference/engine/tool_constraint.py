"""Decoding held to a tool call (``SamplingParams.tool_call``: OpenAI's ``tool_choice`` "required"
or a named function), in the model's own GLM-4.5+ call format.

The reply follows the format token by token, as the chat template writes a call
(``inference.tool_prompt``), so what the model is made to write is what it was trained on:

1. a think part first where there is one: GLM-4.7 with thinking on (the prompt opened it) writes
   freely up to ``</think>``; GLM-4.5 with thinking on may open one (``\\n<think>``) or go
   straight to the call;
2. ``<tool_call>`` and then one of the tools' names (only the named one, for a named function);
3. each argument: its key one of the tool's declared properties not given yet, its value one of
   the ``enum`` values (``true``/``false`` for a boolean) where the schema lists them, otherwise
   free text up to ``</arg_value>`` (no tag, no end of reply inside); ``</tool_call>`` once every
   ``required`` key is given (a tool that declares no properties takes no arguments);
4. then the end of the reply, or (``tool_choice`` "required") another call.

Where only one token may come next it is written without asking the model (as
``inference.engine.choices`` does for a reply that is down to one choice). It needs the tags as
single tokens (GLM-4.5 and later tokenizers have them). Like ``Choices``, the constraint answers
``allowed(written)`` (the tokens that may come next: a list, ``AnyBut`` a few, or None) and
``rest(written)`` (the tokens forced after the one just drawn).
"""

from __future__ import annotations

import json
from collections.abc import Generator

from inference.engine.choices import AnyBut
from inference.tokenizer import THINK_CLOSE, THINK_OPEN, ChatTokenizer
from inference.tool_calls import ForcedToolCall, ToolSpec
from inference.tool_parser import (
    CALL_CLOSE,
    CALL_OPEN,
    KEY_CLOSE,
    KEY_OPEN,
    TOOL_TAGS,
    VALUE_CLOSE,
    VALUE_OPEN,
)
from inference.tool_prompt import Markup

Allowed = list[int] | AnyBut | None
Grammar = Generator[Allowed, int, int]


class ToolCallConstraint:
    def __init__(self, tokenizer: ChatTokenizer, forced: ForcedToolCall, eos_token_ids: list[int]):
        if not tokenizer.has_tool_tokens:
            raise ValueError("a forced tool call needs the tool-call tags as tokens (GLM-4.5 and later tokenizers)")
        if not forced.tools:
            raise ValueError("a forced tool call needs at least one tool")
        self.tokenizer, self.forced, self.eos = tokenizer, forced, list(eos_token_ids)
        self.sep = Markup("\n" if tokenizer.layout == "glm45" else "")
        tag = {t: tokenizer.tokenizer.token_to_id(t) for t in (*TOOL_TAGS, THINK_OPEN, THINK_CLOSE)}
        self.think_close, self.value_close = tag[THINK_CLOSE], tag[VALUE_CLOSE]
        self.in_think = AnyBut([*self.eos, tag[CALL_OPEN]])
        self.in_value = AnyBut([*self.eos, *(i for t, i in tag.items() if t != VALUE_CLOSE)])
        self._restart()

    # -- the engine's interface -----------------------------------------------------------------
    def allowed(self, written: list[int]) -> Allowed:
        self._sync(written)
        return self._current

    def rest(self, written: list[int]) -> list[int]:
        self._sync(written)
        forced = []
        while isinstance(self._current, list) and len(self._current) == 1:
            token = self._current[0]
            forced.append(token)
            self._advance(token)
            if token in self.eos:
                break
        return forced

    def _restart(self) -> None:
        self._grammar = self._reply()
        self._current: Allowed = next(self._grammar)
        self._consumed = 0

    def _sync(self, written: list[int]) -> None:
        if len(written) < self._consumed:  # never expected: the completion only grows
            self._restart()
        for token in written[self._consumed:]:
            self._advance(token)

    def _advance(self, token: int) -> None:
        self._consumed += 1
        try:
            self._current = self._grammar.send(token)
        except StopIteration:
            self._current = None  # the reply has ended

    # -- the call format --------------------------------------------------------------------------
    def _ids(self, *pieces: str) -> list[int]:
        return self.tokenizer.encode_reply(list(pieces))

    def _reply(self) -> Grammar:
        forced, sep = self.forced, self.sep
        opening = self._ids(sep, Markup(CALL_OPEN))
        if forced.may_think:
            thinks = yield from self._one_of([self._ids(Markup("\n" + THINK_OPEN)), opening])
            if thinks == 0:
                yield from self._free(self.in_think, self.think_close)
                yield from self._one_of([opening])
        elif forced.think_first:
            yield from self._free(self.in_think, self.think_close)
            yield from self._one_of([opening])
        else:
            yield from self._one_of([opening])
        while True:
            yield from self._call()
            ends = [[e] for e in self.eos]
            if forced.once:
                yield from self._one_of(ends)
                return 0
            if (yield from self._one_of([*ends, opening])) < len(ends):
                return 0

    def _call(self) -> Grammar:
        """A call's name and arguments, after ``<tool_call>`` and up to ``</tool_call>``."""
        sep, tools = self.sep, self.forced.tools
        ends = [(tool, tag) for tool in tools for tag in (KEY_OPEN, CALL_CLOSE) if self._may_end(tool, set(), tag)]
        chosen = yield from self._one_of([self._ids(tool.name, sep, Markup(tag)) for tool, tag in ends])
        tool, tag = ends[chosen]
        given: set[str] = set()
        while tag == KEY_OPEN:
            keys = [k for k in _properties(tool) if k not in given]
            key = keys[(yield from self._one_of(
                [self._ids(k, Markup(KEY_CLOSE), sep, Markup(VALUE_OPEN)) for k in keys]))]
            given.add(key)
            values = _listed_values(tool.parameter(key))
            if values:
                yield from self._one_of([self._ids(v, Markup(VALUE_CLOSE), sep) for v in values])
            else:
                yield from self._free(self.in_value, self.value_close)
                yield from self._one_of([self._ids(sep)])
            nexts = [t for t in (KEY_OPEN, CALL_CLOSE) if self._may_end(tool, given, t)]
            tag = nexts[(yield from self._one_of([self._ids(Markup(t)) for t in nexts]))]
        return 0

    @staticmethod
    def _may_end(tool: ToolSpec, given: set[str], tag: str) -> bool:
        """May the arguments go on with ``tag``: another key while one is left, the end once
        every required key is given."""
        if tag == KEY_OPEN:
            return any(k not in given for k in _properties(tool))
        return all(k in given for k in tool.required if k in _properties(tool))

    @staticmethod
    def _one_of(options: list[list[int]]) -> Grammar:
        """One of ``options`` (none a prefix of another), token by token; returns its index."""
        written: list[int] = []
        while True:
            alive = [i for i, o in enumerate(options) if o[: len(written)] == written]
            if not alive:
                raise ValueError("a token outside the tool-call format was written")
            done = [i for i in alive if len(options[i]) == len(written)]
            if done:
                return done[0]
            written.append((yield sorted({options[i][len(written)] for i in alive})))

    @staticmethod
    def _free(allowed: AnyBut, until: int) -> Grammar:
        """Free text (but for ``allowed``'s exclusions) up to and with the token ``until``."""
        while (yield allowed) != until:
            pass
        return 0


def _properties(tool: ToolSpec) -> list[str]:
    properties = tool.parameters.get("properties")
    return [k for k in properties if isinstance(k, str) and k] if isinstance(properties, dict) else []


def _listed_values(schema: dict | None) -> list[str]:
    """The texts a value may be, where its schema lists them (``enum``, ``const``, a boolean)."""
    if not isinstance(schema, dict):
        return []
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        values = schema["enum"]
    elif "const" in schema:
        values = [schema["const"]]
    elif schema.get("type") == "boolean":
        values = [True, False]
    else:
        return []
    texts = [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in values]
    return [t for i, t in enumerate(texts) if t and t not in texts[:i]]
