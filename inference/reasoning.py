"""A reasoning model's reply, split into its think part and its answer as the text streams in.

GLM-4.5 and later write ``<think>reasoning</think>answer``. Where the think part begins depends
on the chat template: GLM-4.5/4.6 leave the tag to the model (the reply opens with ``<think>``,
often after a newline), GLM-4.7/GLM-5 pre-fill ``<think>`` in the prompt (the reply is reasoning
up to ``</think>``), and with thinking switched off the template pre-fills an empty think part
(the reply is all answer). ``ReasoningSplitter(start=...)`` says which:

- ``"answer"``: the reply may open with ``<think>`` (leading whitespace allowed); if it does not,
  it is all answer;
- ``"thinking"``: the prompt opened the think part; everything up to ``</think>`` is reasoning;
- ``"unknown"``: either of the two. Text that does not open with ``<think>`` is held back until
  ``</think>`` shows it was reasoning, or the end shows it was the answer: nothing that may be
  reasoning is ever released as answer.

A think part is only recognised at the start of a reply: once the answer has begun, a literal
``<think>`` is answer text. A think part that never ends (the reply was cut off by ``max_tokens``)
is reasoning to the end, so the answer is then empty. A tag split across deltas (``"<thi"``,
``"nk>"``) is held back until it is complete or cannot be a tag any more; the newlines GLM writes
between ``</think>`` and the answer are not part of the answer (the chat template strips them too).

Pure text in, text out: the engine produces text; the worker and the /v1 API split it.
"""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
STARTS = ("answer", "thinking", "unknown")


class ReasoningSplitter:
    """``feed(delta) -> (reasoning_delta, answer_delta)`` per piece of text, then ``finish()``.

    ``reasoning`` and ``answer`` hold everything released so far; ``thought`` says whether the
    reply had a think part at all (even an empty one).
    """

    def __init__(self, start: str = "answer"):
        if start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, got {start!r}")
        self.start = start
        # "opening": may still open with <think>; "undecided": held until </think> or the end;
        # "thinking"; "after": the newlines before the answer; "answer"; "finished".
        self.state = "thinking" if start == "thinking" else "opening"
        self.thought = start == "thinking"
        self.held = ""
        self.reasoning = ""
        self.answer = ""
        self._searched = 0  # how much of an undecided held text holds no complete </think>

    def feed(self, delta: str) -> tuple[str, str]:
        if self.state == "finished":
            raise RuntimeError("feed after finish")
        self.held += delta
        reasoning, answer = [], []
        while self.held:
            before = (self.state, len(self.held))
            self._step(reasoning, answer)
            if (self.state, len(self.held)) == before:
                break  # waiting for more text
        return self._release(reasoning, answer)

    def finish(self) -> tuple[str, str]:
        """What was held back: reasoning inside an unterminated think part, else answer."""
        held, self.held = self.held, ""
        state, self.state = self.state, "finished"
        if state == "thinking":
            return self._release([held], [])
        if state == "after":
            return self._release([], [])
        return self._release([], [held])

    def assume_answer(self) -> str:
        """The reply's text is known to be answer (a server sent the reasoning apart): stop
        waiting for a think part, or leave one that only the prompt opened and no text entered
        yet; returns the held text, now answer."""
        fresh_thinking = self.state == "thinking" and not (self.reasoning or self.held)
        if self.state not in ("opening", "undecided") and not fresh_thinking:
            return ""
        self.state = "answer"
        held, self.held = self.held, ""
        return self._release([], [held])[1]

    # -- the states ----------------------------------------------------------------------------
    def _step(self, reasoning: list[str], answer: list[str]) -> None:
        if self.state == "opening":
            self._opening(answer)
        elif self.state == "undecided":
            self._undecided(reasoning)
        elif self.state == "thinking":
            self._thinking(reasoning)
        elif self.state == "after":
            rest = self.held.lstrip("\n")
            if rest:
                self.held, self.state = rest, "answer"
            else:
                self.held = ""
        else:  # answer
            answer.append(self.held)
            self.held = ""

    def _opening(self, answer: list[str]) -> None:
        text = self.held.lstrip()
        if text.startswith(THINK_OPEN):
            self.held, self.state, self.thought = text[len(THINK_OPEN):], "thinking", True
        elif THINK_OPEN.startswith(text):
            pass  # only whitespace, or a tag still arriving
        elif self.start == "unknown":
            self.state = "undecided"
        else:
            self.state = "answer"

    def _undecided(self, reasoning: list[str]) -> None:
        # The held text can grow to a whole reply: search only what arrived since last time.
        index = self.held.find(THINK_CLOSE, max(0, self._searched - len(THINK_CLOSE) + 1))
        self._searched = len(self.held)
        if index >= 0:
            reasoning.append(self.held[:index])
            self.held, self.state, self.thought = self.held[index + len(THINK_CLOSE):], "after", True

    def _thinking(self, reasoning: list[str]) -> None:
        index = self.held.find(THINK_CLOSE)
        if index >= 0:
            reasoning.append(self.held[:index])
            self.held, self.state = self.held[index + len(THINK_CLOSE):], "after"
            return
        keep = _partial_suffix(self.held, THINK_CLOSE)
        reasoning.append(self.held[: len(self.held) - keep])
        self.held = self.held[len(self.held) - keep:]

    def _release(self, reasoning: list[str], answer: list[str]) -> tuple[str, str]:
        r, a = "".join(reasoning), "".join(answer)
        self.reasoning += r
        self.answer += a
        return r, a


def split_reasoning(text: str, start: str = "answer") -> tuple[str, str]:
    """A whole reply as (reasoning, answer)."""
    splitter = ReasoningSplitter(start)
    reasoning, answer = splitter.feed(text)
    tail_reasoning, tail_answer = splitter.finish()
    return reasoning + tail_reasoning, answer + tail_answer


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
