"""The request body's read deadline (app/body_reader.py) without gunicorn: checked between reads,
and the watchdog that ends a read blocked on a socket."""

from __future__ import annotations

import io
import socket
import time

import pytest
from flask import Flask

from app.body_reader import WATCHDOG, BodyTooSlow, read_body


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
