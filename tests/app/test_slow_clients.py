"""Slow clients cannot starve the web service: 100 uploads trickling to ``/wecom/callback``
while ``/healthz`` keeps answering within 100 ms, against gunicorn as deployed (2 processes
of 4 threads here: far fewer threads than slow clients) and with nginx in front (skipped only
without an nginx binary). Past ``REQUEST_BODY_TIMEOUT_S`` a slow body gets 408, never a 500:
from the worker's event loop for a ``Content-Length`` or chunked body, from the app's own read
deadline (app/web/body_reader.py) for one too large to collect there, on the callback, on ``/v1``
and on the admin area's login and document upload (whose CSRF check read the form with no
deadline: 3 chunked logins and 3 uploads of 10 MB held their threads for as long as they liked).
"""

from __future__ import annotations

import contextlib
import http.client
import math
import socket
import threading
import time

import pytest

from tests.support.api_server import ApiServer
from tests.support.nginx import NGINX, Nginx

pytestmark = pytest.mark.integration

SLOW = 100
BODY = 2000
DEADLINE_S = 3
HEALTHZ_BOUND_S = 0.100


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REQUEST_BODY_TIMEOUT_S", str(DEADLINE_S))
        server = ApiServer(tmp_path_factory.mktemp("slow"), workers=2, threads=4)
    yield server
    server.stop()


def callback_head(length: int | None) -> bytes:
    query = f"msg_signature=x&timestamp={int(time.time())}&nonce=n"
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"POST /wecom/callback?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n{size}\r\n"
            f"Content-Type: text/xml\r\n\r\n").encode()


class Trickle:
    """Sends each connection one more body byte every ``every_s`` until stopped."""

    def __init__(self, conns: list, every_s: float = 0.2):
        self.conns, self.every_s = conns, every_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopped.wait(self.every_s):
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.send(b"x")

    def stop(self):
        self.stopped.set()
        self.thread.join(5)


def probe(connect, count: int = 60, pause_s: float = 0.02) -> list[float]:
    """Seconds each ``GET /healthz`` took, a fresh connection each; every answer must be 200."""
    took = []
    for _ in range(count):
        started = time.perf_counter()
        conn = connect()
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            assert resp.status == 200, resp.read()[:200]
            resp.read()
        finally:
            conn.close()
        took.append(time.perf_counter() - started)
        time.sleep(pause_s)
    return took


def p99(values: list[float]) -> float:
    return sorted(values)[math.ceil(0.99 * len(values)) - 1]


def report(where: str, took: list[float], slow: int = SLOW) -> str:
    return (f"{where}: healthz p50 {sorted(took)[len(took) // 2] * 1000:.1f} ms, "
            f"p99 {p99(took) * 1000:.1f} ms, max {max(took) * 1000:.1f} ms over {len(took)} probes "
            f"with {slow} slow uploads")


def answer(sock) -> bytes:
    sock.settimeout(DEADLINE_S + 5)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except OSError:
        pass
    return b"".join(chunks)


def test_slow_uploads_leave_healthz_fast_and_get_408_at_the_deadline(web):
    port = int(web.url.rsplit(":", 1)[1])
    slow = []
    started = time.monotonic()
    for _ in range(SLOW):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(callback_head(BODY) + b"<xml>")
        slow.append(sock)
    trickle = Trickle(slow)
    try:
        took = probe(lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=5))
        assert time.monotonic() - started < DEADLINE_S  # every probe ran while all 100 were held
        print(report("gunicorn", took))
        assert p99(took) < HEALTHZ_BOUND_S, report("gunicorn", took)
        answers = [answer(sock) for sock in slow]  # still trickling: cut at the deadline
    finally:
        trickle.stop()
        for sock in slow:
            sock.close()
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:40] for a in answers}


@pytest.mark.parametrize("path", ["/wecom/callback", "/v1/chat/completions"])
def test_a_chunked_body_past_the_deadline_gets_408_from_the_app(web, path):
    port = int(web.url.rsplit(":", 1)[1])
    _, key = web.new_key()
    head = callback_head(None)
    if path.startswith("/v1"):
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
                "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head + b"1\r\n{\r\n")
    started = time.monotonic()
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.3):
            try:
                sock.send(b"1\r\n \r\n")
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    try:
        got = answer(sock)
    finally:
        stop.set()
        sock.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:300]
    assert DEADLINE_S - 0.5 < time.monotonic() - started < DEADLINE_S + 3
    assert b"too slow" in got or b"in time" in got


@pytest.mark.skipif(not NGINX, reason="nginx is not installed (NGINX_BIN names one elsewhere)")
def test_slow_uploads_through_nginx_leave_healthz_fast(web, tmp_path):
    proxy = Nginx(tmp_path, int(web.url.rsplit(":", 1)[1]))
    slow = []
    try:
        # From four addresses, so that all 100 stay under nginx's limit_conn per address.
        for i in range(SLOW):
            tls = proxy.tls_connect(source=f"127.0.0.{3 + i % 4}")
            tls.sendall(callback_head(BODY) + b"<xml>")
            slow.append(tls)
        trickle = Trickle(slow)
        try:
            took = probe(lambda: http.client.HTTPSConnection(
                "127.0.0.1", proxy.port, timeout=5, source_address=("127.0.0.2", 0),
                context=_context(proxy.ca)))
        finally:
            trickle.stop()
        print(report("nginx+gunicorn", took))
        assert p99(took) < HEALTHZ_BOUND_S, report("nginx+gunicorn", took)
    finally:
        for tls in slow:
            tls.close()
        proxy.stop()


def _context(ca: str):
    import ssl

    return ssl.create_default_context(cafile=ca)


def slow_head(path: str, length: int | None) -> bytes:
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{size}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n\r\n").encode()


class ChunkTrickle(Trickle):
    """One more one-byte chunk on each connection every ``every_s``."""

    def _run(self):
        while not self.stopped.wait(self.every_s):
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.send(b"1\r\nx\r\n")


def test_slow_admin_logins_and_uploads_leave_healthz_fast_and_get_408(web):
    """Five chunked logins and three 10 MB uploads trickling: eight slow clients, as many as
    gunicorn's threads here. The logins are collected by the worker's event loop (no thread);
    the uploads, too large for it, are read by the app under the deadline (a thread each, for
    at most REQUEST_BODY_TIMEOUT_S, never past it), before CSRF or the form parser sees them."""
    port = int(web.url.rsplit(":", 1)[1])
    logins, uploads = [], []
    started = time.monotonic()
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(slow_head("/admin/login", None) + b"4\r\nname\r\n")
        logins.append(sock)
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(slow_head("/admin/knowledge/upload", 10 * 1024 * 1024) + b"--boundary")
        uploads.append(sock)
    trickles = [ChunkTrickle(logins), Trickle(uploads)]
    try:
        took = probe(lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=5), count=40)
        assert time.monotonic() - started < DEADLINE_S  # every probe ran while all 8 were held
        print(report("gunicorn, slow admin bodies", took, 8))
        assert p99(took) < HEALTHZ_BOUND_S, report("gunicorn, slow admin bodies", took, 8)
        answers = [answer(sock) for sock in logins + uploads]
    finally:
        for trickle in trickles:
            trickle.stop()
        for sock in logins + uploads:
            sock.close()
    assert time.monotonic() - started < DEADLINE_S + 5
    assert all(a.startswith(b"HTTP/1.1 408") and b"in time" in a for a in answers), \
        {a[:60] for a in answers}
