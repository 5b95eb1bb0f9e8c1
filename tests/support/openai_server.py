"""A small OpenAI-compatible chat server for tests of the ``openai`` backend.

It answers deterministically from the request, so a test can tell which question an answer
belongs to and whether the conversation history arrived: the reply names the number of user
turns it saw and echoes the last one. ``delay_s`` makes generation take time (to kill a worker
mid-generation); ``fail_next`` makes the next calls answer 500 (to test retries);
``stream_piece_delay_s`` streams an answer a few characters at a time with that pause between
pieces, as a model writes it (to watch a stream grow).

``reasoning`` makes it answer as a reasoning model (GLM-4.5+) does, in one of ``REASONING_MODES``
(a ``#reasoning=MODE`` in the last user message chooses for that answer alone):
``inline`` writes ``\n<think>...</think>\n`` before the answer in ``content`` (a server without
a reasoning parser, GLM-4.5's template); ``prefilled`` writes only ``...</think>`` before it (the
template opened ``<think>``, GLM-4.7's); ``separate`` sends the thinking as ``reasoning_content``
(a server with a reasoning parser); ``cutoff`` thinks inline until ``max_tokens`` ends it, with no
answer (``finish_reason`` "length"). The thinking contains ``THINKING``, so a test can tell
whether any of it got through; ``completion_tokens`` counts it, as a server does. A reasoning
model's stream comes in pieces of 3 characters, so tags arrive split across deltas.
With ``tools`` (and a ``tool_choice`` other than "none") it answers as a server with a tool
parser does: one call of the named function (or of the first tool), id ``call_fake_<n>``,
arguments ``{"question": <the last user message>}``, ``finish_reason`` "tool_calls"; streamed,
the id and name first, then the arguments in two pieces. After a ``tool`` message it answers
with the results it was given (``工具结果: ...``), as a model that read them.
``last_body`` is the last request, ``bodies`` every one, ``prompts`` the messages of the last
``PROMPTS_KEPT`` (what the model was shown: a test looks for a passage that must not be there);
``scripted`` maps words of a question to the reply a test wants for it (a model's own "not
found", an answer in Markdown). Served with keep-alive, as model servers are
(``emulator/http_server.py``).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque

from flask import Flask, Response, jsonify, request

from emulator.http_server import WSGIServer

THINKING = "THINKING-7e1f 用户在问问题，先想一想再回答。"
REASONING_MODES = ("inline", "prefilled", "separate", "cutoff")
_MODE = re.compile(r"#reasoning=(\w+)")
PROMPTS_KEPT = 1000
BODIES_KEPT = 200  # the last requests, whole (a long run keeps no more)


def reply_for(messages: list[dict], choice: list[str] | None = None,
              scripted: dict[str, str] | None = None) -> str:
    """The echo reply; with vLLM's ``guided_choice``, one of the choices (the last, so that a
    test sees the list arrived whole); a ``scripted`` reply when the last question holds its
    words and the prompt holds passages (``"Passages"``), or ``scripted["*"]`` without them."""
    if choice:
        return choice[-1]
    users = [m["content"] for m in messages if m.get("role") == "user"]
    grounded = any("Passages" in str(m.get("content")) for m in messages if m.get("role") == "system")
    for words, reply in (scripted or {}).items():
        if grounded and users and isinstance(users[-1], str) and words in users[-1]:
            return reply
    if not grounded and (scripted or {}).get("*"):
        return scripted["*"]
    return f"答复#{len(users)}: {users[-1] if users else ''}"


def tool_call_for(body: dict, number: int) -> dict | None:
    """The call a tool-using model makes for ``body``, or None (no tools, "none", results in)."""
    tools, choice = body.get("tools") or [], body.get("tool_choice", "auto")
    if not tools or choice == "none" or body["messages"][-1].get("role") == "tool":
        return None
    name = choice["function"]["name"] if isinstance(choice, dict) else tools[0]["function"]["name"]
    users = [m["content"] for m in body["messages"] if m.get("role") == "user"]
    arguments = json.dumps({"question": users[-1] if users else ""}, ensure_ascii=False)
    return {"id": f"call_fake_{number}", "type": "function", "function": {"name": name, "arguments": arguments}}


def reasoning_mode(messages: list[dict], default: str | None) -> str | None:
    users = [m["content"] for m in messages if m.get("role") == "user"]
    found = _MODE.search(users[-1]) if users else None
    mode = found.group(1) if found else default
    if mode is not None and mode not in REASONING_MODES:
        raise ValueError(f"unknown reasoning mode {mode!r}")
    return mode


def written(answer: str, mode: str | None) -> tuple[str, str, str]:
    """(reasoning_content, content, finish_reason) of a reply in ``mode``."""
    if mode == "inline":
        return "", f"\n<think>{THINKING}</think>\n{answer}", "stop"
    if mode == "prefilled":
        return "", f"{THINKING}</think>{answer}", "stop"
    if mode == "separate":
        return THINKING, answer, "stop"
    if mode == "cutoff":
        return "", f"<think>{THINKING}", "length"
    return "", answer, "stop"


class FakeOpenAIServer:
    def __init__(self, delay_s: float = 0.0, stream_piece_delay_s: float = 0.0,
                 reasoning: str | None = None):
        self.delay_s = delay_s
        self.stream_piece_delay_s = stream_piece_delay_s
        self.reasoning = reasoning
        self.last_body: dict | None = None
        self.bodies: deque[dict] = deque(maxlen=BODIES_KEPT)
        self.scripted: dict[str, str] = {}
        self.prompts: deque[list[dict]] = deque(maxlen=PROMPTS_KEPT)
        self.fail_next = 0
        self.calls = 0
        self.in_flight = 0  # generations started and not yet answered
        self.lock = threading.Lock()
        self.app = self._build()
        self._server = WSGIServer(self.app, "127.0.0.1", 0, name="fake-openai")
        self.url = f"http://127.0.0.1:{self._server.port}/v1"

    def start(self) -> FakeOpenAIServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def _build(self) -> Flask:
        app = Flask("fake-openai")

        @app.post("/v1/chat/completions")
        def completions():
            with self.lock:
                self.calls += 1
                if self.fail_next > 0:
                    self.fail_next -= 1
                    return jsonify(error={"message": "injected failure"}), 500
            body = request.get_json(force=True)
            self.last_body = body
            self.bodies.append(body)
            self.prompts.append(body.get("messages") or [])
            if self.delay_s:
                with self.lock:
                    self.in_flight += 1
                try:
                    time.sleep(self.delay_s)
                finally:
                    with self.lock:
                        self.in_flight -= 1
            text = reply_for(body["messages"], body.get("guided_choice"), self.scripted)
            if body["messages"][-1].get("role") == "tool":
                text = "工具结果: " + "; ".join(m["content"] for m in body["messages"] if m.get("role") == "tool")
            mode = reasoning_mode(body["messages"], self.reasoning)
            reasoning, content, finish = written(text, mode)
            call = tool_call_for(body, self.calls)
            if call is not None:
                content, finish = "", "tool_calls"
            prompt_tokens = sum(len(m.get("content") or "") for m in body["messages"]) + \
                len(json.dumps(body.get("tools") or []))
            completion_tokens = len(reasoning) + len(content)
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                     "total_tokens": prompt_tokens + completion_tokens}
            if body.get("stream"):
                def pieces():
                    if call is not None:  # a call and no text (its reasoning, if any, first)
                        return [("reasoning_content", reasoning[i:i + 3]) for i in range(0, len(reasoning), 3)]
                    if mode is None and not self.stream_piece_delay_s:
                        return [("content", text[: len(text) // 2]), ("content", text[len(text) // 2 :])]
                    return [(field, value[i:i + 3]) for field, value in
                            (("reasoning_content", reasoning), ("content", content))
                            for i in range(0, len(value), 3)]

                def events():
                    if call is not None:
                        arguments = call["function"]["arguments"]
                        for delta in ({"index": 0, "id": call["id"], "type": "function",
                                       "function": {"name": call["function"]["name"], "arguments": ""}},
                                      {"index": 0, "function": {"arguments": arguments[:5]}},
                                      {"index": 0, "function": {"arguments": arguments[5:]}}):
                            chunk = {"model": body["model"], "choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]}
                            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                    for index, (field, piece) in enumerate(pieces()):
                        if index and self.stream_piece_delay_s:
                            time.sleep(self.stream_piece_delay_s)
                        chunk = {"model": body["model"], "choices": [{"index": 0, "delta": {field: piece}}]}
                        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                    done = {"model": body["model"], "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                            "usage": usage}
                    yield f"data: {json.dumps(done, ensure_ascii=False)}\n\ndata: [DONE]\n\n"

                return Response(events(), mimetype="text/event-stream")
            message = {"role": "assistant", "content": content or (None if call else "")}
            if reasoning:
                message["reasoning_content"] = reasoning
            if call is not None:
                message["tool_calls"] = [call]
            return jsonify(model=body["model"], object="chat.completion", usage=usage,
                           choices=[{"index": 0, "finish_reason": finish, "message": message}])

        return app
