"""A small OpenAI-compatible chat server for tests of the ``openai`` backend.

It answers deterministically from the request, so a test can tell which question an answer
belongs to and whether the conversation history arrived: the reply names the number of user
turns it saw and echoes the last one. ``delay_s`` makes generation take time (to kill a worker
mid-generation); ``fail_next`` makes the next calls answer 500 (to test retries);
``stream_piece_delay_s`` streams an answer a few characters at a time with that pause between
pieces, as a model writes it (to watch a stream grow).
"""

from __future__ import annotations

import json
import threading
import time

from flask import Flask, Response, jsonify, request
from werkzeug.serving import make_server


def reply_for(messages: list[dict]) -> str:
    users = [m["content"] for m in messages if m.get("role") == "user"]
    return f"答复#{len(users)}: {users[-1] if users else ''}"


class FakeOpenAIServer:
    def __init__(self, delay_s: float = 0.0, stream_piece_delay_s: float = 0.0):
        self.delay_s = delay_s
        self.stream_piece_delay_s = stream_piece_delay_s
        self.fail_next = 0
        self.calls = 0
        self.in_flight = 0  # generations started and not yet answered
        self.lock = threading.Lock()
        self.app = self._build()
        self._server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()

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
            if self.delay_s:
                with self.lock:
                    self.in_flight += 1
                try:
                    time.sleep(self.delay_s)
                finally:
                    with self.lock:
                        self.in_flight -= 1
            text = reply_for(body["messages"])
            prompt_tokens = sum(len(m["content"]) for m in body["messages"])
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(text),
                     "total_tokens": prompt_tokens + len(text)}
            if body.get("stream"):
                def pieces():
                    if not self.stream_piece_delay_s:
                        return [text[: len(text) // 2], text[len(text) // 2 :]]
                    return [text[i:i + 3] for i in range(0, len(text), 3)]

                def events():
                    for index, piece in enumerate(pieces()):
                        if index and self.stream_piece_delay_s:
                            time.sleep(self.stream_piece_delay_s)
                        chunk = {"model": body["model"], "choices": [{"index": 0, "delta": {"content": piece}}]}
                        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                    done = {"model": body["model"], "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                            "usage": usage}
                    yield f"data: {json.dumps(done, ensure_ascii=False)}\n\ndata: [DONE]\n\n"

                return Response(events(), mimetype="text/event-stream")
            return jsonify(model=body["model"], object="chat.completion", usage=usage,
                           choices=[{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": text}}])

        return app
