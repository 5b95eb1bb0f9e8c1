"""The request body's read deadline (app/web/body_reader.py) without gunicorn: checked between reads,
and the watchdog that ends a read blocked on a socket."""

from __future__ import annotations

import io
import socket
import time

import pytest
from flask import Flask

from app.web.body_reader import WATCHDOG, BodyTooSlow, read_body


class Trickle(io.RawIOBase):
    """A body that arrives one byte per read, each after ``pause_s``."""

    def __init__(self, size: int, pause_s: float):
        self.left, self.pause_s = size, pause_s

    def readable(self):
        return True

    def readinto(self, buffer):
        if not self.left:
            return 0
        time.sleep(self.pause_s)
        buffer[0:1] = b"x"
        self.left -= 1
        return 1


def read(size: int, pause_s: float, timeout_s: float, limit: int = 1000) -> bytes:
    app = Flask(__name__)
    with app.test_request_context("/", method="POST", environ_overrides={
            "wsgi.input": Trickle(size, pause_s), "CONTENT_LENGTH": str(size)}):
        return read_body(limit, timeout_s)


def test_a_body_in_time_is_read_whole():
    assert read(20, 0.001, 2.0) == b"x" * 20


def test_a_trickling_body_gets_408_at_the_deadline():
    started = time.monotonic()
    with pytest.raises(BodyTooSlow) as raised:
        read(1000, 0.02, 0.3)
    assert raised.value.code == 408 and time.monotonic() - started < 1.0


def test_the_watchdog_ends_a_blocked_read_at_its_deadline_and_not_before_a_done_one():
    server, client = socket.socketpair()
    with server, client:
        entry = WATCHDOG.watch(server, time.monotonic() + 0.2)
        started = time.monotonic()
        assert server.recv(10) == b""  # blocked until the watchdog shut it for reading
        assert 0.15 < time.monotonic() - started < 2 and WATCHDOG.done(entry)
    server, client = socket.socketpair()
    with server, client:
        assert not WATCHDOG.done(WATCHDOG.watch(server, time.monotonic() + 0.1))
        time.sleep(0.3)
        client.sendall(b"still open")
        assert server.recv(10) == b"still open"


def _body_first_app():
    from app.web.body_reader import BodyFirst, raise_body_error

    app = Flask(__name__)
    app.wsgi_app = BodyFirst(app.wsgi_app, 1.0, lambda path: 100)
    app.before_request(raise_body_error)

    @app.post("/form")
    def form():
        from flask import request

        return {"name": request.form.get("name"), "length": request.content_length}

    return app


def test_body_first_reads_the_body_before_any_hook_and_only_the_body():
    """On a server whose input is the connection itself (Werkzeug's), a keep-alive request's
    body ends at its Content-Length, not at the connection's end; chunked bodies are whole too."""
    import http.client
    import threading

    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, _body_first_app(), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=5)
        conn.request("POST", "/form", body=b"name=ada", headers={
            "Content-Type": "application/x-www-form-urlencoded", "Connection": "keep-alive"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b'{"length":8,"name":"ada"}\n'
        conn.request("POST", "/form", body=iter([b"name=", b"grace"]), encode_chunked=True, headers={
            "Content-Type": "application/x-www-form-urlencoded", "Transfer-Encoding": "chunked"})
        resp = conn.getresponse()
        assert resp.status == 200 and b'"name":"grace"' in resp.read()
        conn.request("POST", "/form", body=b"x" * 101, headers={"Content-Type": "text/plain"})
        assert conn.getresponse().status == 413
        conn.close()
    finally:
        server.shutdown()


def test_body_first_answers_a_trickled_body_408_before_the_form_is_parsed():
    app = _body_first_app()
    with app.test_request_context("/form", method="POST", environ_overrides={
            "wsgi.input": Trickle(50, 0.1), "CONTENT_LENGTH": "50", "CONTENT_TYPE": "text/plain"}) as ctx:
        environ = ctx.request.environ
    answered = []
    app.wsgi_app(environ, lambda status, headers, *_: answered.append(status))
    assert answered == ["408 REQUEST TIMEOUT"]
