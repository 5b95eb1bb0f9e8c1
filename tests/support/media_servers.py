"""Small OpenAI-compatible servers for voice and images, checking what they receive.

``FakeASRServer`` serves ``POST /v1/audio/transcriptions`` (multipart: ``file``, ``model``): the
file must be a WAV, 16-bit mono at 16 kHz, at least ``min_seconds`` long, and the model the one
configured; anything else is a 400 naming what was wrong (and kept in ``problems``). It answers
``{"text": text}``. ``fail_next`` answers 503 that many times; ``delay_s`` makes it slow.

``FakeVisionServer`` serves ``POST /v1/chat/completions`` for a vision model: the last user
message must hold a text part and at least one ``image_url`` part whose data URL decodes to a PNG,
JPEG or GIF; it answers ``看到N张图片(WxH PNG...): <the text>``, so a test sees that the text and
the images arrived together. ``bodies`` keeps every request.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import threading
import time
import wave

from flask import Flask, Response, jsonify, request

from emulator.http_server import WSGIServer


class StandInServer:
    """What every stand-in model server here shares: a thread serving ``app`` on a free port,
    the calls counted, failures and delays injected, refusals kept."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = 0
        self.fail_next = 0
        self.delay_s = 0.0
        self.problems: list[str] = []
        self.app = self._build()
        self._server = WSGIServer(self.app, "127.0.0.1", 0, name=type(self).__name__)
        self.url = f"http://127.0.0.1:{self._server.port}/v1"

    def start(self):
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def _enter(self):
        """Count the call; a queued failure or delay applies. A response when it fails."""
        with self.lock:
            self.calls += 1
            if self.fail_next > 0:
                self.fail_next -= 1
                return jsonify(error={"message": "injected failure"}), 503
        if self.delay_s:
            time.sleep(self.delay_s)
        return None

    def _json_body(self):
        """(the request's JSON body, kept in ``bodies``, None), or (None, the failure to answer)
        when a failure is queued."""
        failed = self._enter()
        if failed is not None:
            return None, failed
        body = request.get_json(force=True)
        with self.lock:
            self.bodies.append(body)
        return body, None

    def _refuse(self, problem: str):
        with self.lock:
            self.problems.append(problem)
        return jsonify(error={"message": problem}), 400

    def _build(self) -> Flask:
        raise NotImplementedError


class FakeASRServer(StandInServer):
    def __init__(self, text: str = "年假有几天", model: str = "test-asr", min_seconds: float = 0.5):
        self.text, self.model, self.min_seconds = text, model, min_seconds
        self.received: list[dict] = []
        super().__init__()

    def _build(self) -> Flask:
        app = Flask("fake-asr")

        @app.post("/v1/audio/transcriptions")
        def transcriptions():
            failed = self._enter()
            if failed is not None:
                return failed
            upload = request.files.get("file")
            if upload is None:
                return self._refuse("no file part")
            if request.form.get("model") != self.model:
                return self._refuse(f"model {request.form.get('model')!r} is not {self.model!r}")
            data = upload.read()
            try:
                with wave.open(io.BytesIO(data)) as wav:
                    shape = (wav.getframerate(), wav.getnchannels(), wav.getsampwidth())
                    seconds = wav.getnframes() / wav.getframerate()
            except (wave.Error, EOFError):
                return self._refuse("file is not a WAV")
            if shape != (16000, 1, 2):
                return self._refuse(f"WAV is {shape}, not 16 kHz mono 16-bit")
            if seconds < self.min_seconds:
                return self._refuse(f"only {seconds:.2f}s of audio")
            with self.lock:
                self.received.append({"seconds": seconds, "filename": upload.filename,
                                      "response_format": request.form.get("response_format")})
            return jsonify(text=self.text)

        return app


def _image_shape(data: bytes) -> str:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        width, height = struct.unpack(">II", data[16:24])
        return f"{width}x{height} PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    raise ValueError("not an image")


class FakeVisionServer(StandInServer):
    def __init__(self, model: str = "test-vision"):
        self.model = model
        self.bodies: list[dict] = []
        super().__init__()

    def _build(self) -> Flask:
        app = Flask("fake-vision")

        @app.post("/v1/chat/completions")
        def completions():
            body, failed = self._json_body()
            if failed is not None:
                return failed
            if body.get("model") != self.model:
                return self._refuse(f"model {body.get('model')!r} is not {self.model!r}")
            last = body["messages"][-1]
            if last.get("role") != "user" or not isinstance(last.get("content"), list):
                return self._refuse("the last message is not a user message with content parts")
            texts = [p["text"] for p in last["content"] if p.get("type") == "text"]
            urls = [p["image_url"]["url"] for p in last["content"] if p.get("type") == "image_url"]
            if not texts or not urls:
                return self._refuse("the question needs a text part and an image part")
            shapes = []
            for url in urls:
                head, _, b64 = url.partition(",")
                if not head.startswith("data:image/") or not head.endswith(";base64"):
                    return self._refuse("an image is not a base64 data URL")
                try:
                    shapes.append(_image_shape(base64.b64decode(b64, validate=True)))
                except ValueError:
                    return self._refuse("an image does not decode to PNG, JPEG or GIF")
            text = f"看到{len(urls)}张图片({', '.join(shapes)}): {' '.join(texts)}"
            usage = {"prompt_tokens": 100, "completion_tokens": len(text), "total_tokens": 100 + len(text)}
            if body.get("stream"):
                def events():
                    chunk = {"model": self.model, "choices": [{"index": 0, "delta": {"content": text}}]}
                    yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                    done = {"model": self.model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                            "usage": usage}
                    yield f"data: {json.dumps(done, ensure_ascii=False)}\n\ndata: [DONE]\n\n"

                return Response(events(), mimetype="text/event-stream")
            return jsonify(model=self.model, object="chat.completion", usage=usage,
                           choices=[{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": text}}])

        return app
