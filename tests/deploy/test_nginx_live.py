"""docker/nginx/default.conf in a real nginx in front of the real app (skipped without nginx).

Only the addresses change (``web:8080``, ports 80/443, the certificate folder); the rest is the
file compose mounts. TLS 1.2 is refused at the handshake, a stream on ``/v1/`` reaches the client
while the backend is still holding the rest of it back (it would stall if nginx buffered), and
the app (``TRUSTED_PROXIES=1``) sees the client's address and scheme from nginx's headers, not the
ones a client forged. ``nginx -t`` accepts the file; slow uploads are held in nginx (the backend
sees none of them until its body is whole) and past ``limit_conn`` an address gets 429. ``NGINX_BIN`` names the binary when it is not on PATH.
"""

from __future__ import annotations

import socket
import ssl
import threading

import pytest
import requests
from flask import Response, request
from werkzeug.serving import make_server

from app.web.admin import csrf
from app.web.factory import create_app
from tests.support.env import make_env, redis_url, settings_from
from tests.support.nginx import NGINX, Nginx

pytestmark = pytest.mark.integration
if not NGINX:
    pytest.skip("nginx is not installed (NGINX_BIN names one elsewhere)", allow_module_level=True)


class Gate:
    """A backend route that sends one SSE event, then waits for the test before the rest."""

    def __init__(self):
        self.release = threading.Event()

    def view(self):
        def events():
            yield "data: first\n\n"
            self.release.wait(30)
            yield "data: [DONE]\n\n"

        return Response(events(), mimetype="text/event-stream")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nginx")
    app = create_app(settings_from(make_env(DATABASE_URL=f"sqlite:///{tmp / 'bot.sqlite3'}",
                                            REDIS_URL=redis_url(6), TRUSTED_PROXIES="1")))
    gate = Gate()
    app.add_url_rule("/v1/_gated", "gated", gate.view)
    arrived: list[int] = []  # the body length of each upload the backend was handed

    def upload():
        arrived.append(-1)  # the view runs as soon as the backend has the request's head
        arrived[-1] = len(request.get_data())
        return "ok"

    app.add_url_rule("/wecom/_upload", "upload", upload, methods=["POST"])
    csrf.exempt(upload)  # like the WeCom routes
    app.add_url_rule("/_seen", "seen", lambda: {
        "ip": request.remote_addr, "url": request.url,
        "headers": {k: v for k, v in request.headers.items() if k.startswith("X-")}})
    backend = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=backend.serve_forever, daemon=True).start()

    nginx = Nginx(tmp, backend.server_port)
    yield {"https": nginx.https, "http": nginx.http, "port": nginx.port, "ca": nginx.ca,
           "gate": gate, "arrived": arrived, "checked": nginx.checked}
    nginx.stop()
    gate.release.set()
    backend.shutdown()


def handshake(proxy, version: ssl.TLSVersion) -> str:
    ctx = ssl.create_default_context(cafile=proxy["ca"])
    ctx.minimum_version = ctx.maximum_version = version
    with socket.create_connection(("127.0.0.1", proxy["port"]), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.version()


def test_tls_13_is_accepted_and_12_refused(proxy):
    assert handshake(proxy, ssl.TLSVersion.TLSv1_3) == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        handshake(proxy, ssl.TLSVersion.TLSv1_2)


def test_plain_http_redirects_to_https_and_answers_the_health_check(proxy):
    resp = requests.get(f"{proxy['http']}/v1/models", allow_redirects=False, timeout=10)
    assert resp.status_code == 301 and resp.headers["Location"].startswith("https://")
    health = requests.get(f"{proxy['http']}/nginx-healthz", timeout=10)
    assert health.status_code == 200 and health.text == "ok\n"


def test_the_app_answers_through_nginx(proxy):
    resp = requests.get(f"{proxy['https']}/healthz", verify=proxy["ca"], timeout=10)
    assert resp.status_code == 200 and resp.json() == {"status": "ok"}
    assert resp.headers["Strict-Transport-Security"].startswith("max-age=")


def test_a_stream_on_v1_is_not_buffered(proxy):
    with requests.get(f"{proxy['https']}/v1/_gated", verify=proxy["ca"], stream=True, timeout=10) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line) == b"data: first"  # while the backend waits
        proxy["gate"].release.set()
        assert next(line for line in lines if line) == b"data: [DONE]"


def test_the_app_sees_the_client_not_forged_headers(proxy):
    forged = {"X-Forwarded-For": "6.6.6.6", "X-Forwarded-Host": "evil.example",
              "X-Forwarded-Proto": "http", "X-Forwarded-Prefix": "/evil", "X-Real-IP": "6.6.6.6"}
    seen = requests.get(f"{proxy['https']}/_seen", headers=forged, verify=proxy["ca"], timeout=10).json()
    assert seen["ip"] == "127.0.0.1"
    assert seen["url"].startswith("https://127.0.0.1") and "evil" not in seen["url"]
    assert seen["headers"]["X-Real-Ip"] == "127.0.0.1"
    assert seen["headers"]["X-Forwarded-For"] == "6.6.6.6, 127.0.0.1"  # only the last hop is believed
    assert "X-Forwarded-Prefix" not in seen["headers"]


def test_nginx_t_accepts_the_config(proxy):
    assert proxy["checked"].returncode == 0, proxy["checked"].stderr
    assert "test is successful" in proxy["checked"].stderr


UPLOAD = 4000


def slow_upload(proxy, sent: int):
    """A TLS connection that has sent an upload's head and ``sent`` bytes of its body."""
    ctx = ssl.create_default_context(cafile=proxy["ca"])
    raw = socket.create_connection(("127.0.0.1", proxy["port"]), timeout=10)
    tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    tls.sendall(f"POST /wecom/_upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {UPLOAD}\r\n"
                f"Content-Type: text/xml\r\nConnection: close\r\n\r\n".encode() + b"x" * sent)
    return tls


def answer(tls) -> bytes:
    chunks = []
    while chunk := tls.recv(65536):
        chunks.append(chunk)
    tls.close()
    return b"".join(chunks)


def test_slow_uploads_are_held_in_nginx_not_in_the_backend(proxy):
    proxy["arrived"].clear()
    slow = [slow_upload(proxy, 100) for _ in range(40)]
    try:
        import time

        time.sleep(1.0)
        assert proxy["arrived"] == []  # unbuffered, the backend would hold 40 reading threads
        started = time.perf_counter()
        health = requests.get(f"{proxy['https']}/healthz", verify=proxy["ca"], timeout=10)
        assert health.status_code == 200 and time.perf_counter() - started < 0.1
        for tls in slow:
            tls.sendall(b"x" * (UPLOAD - 100))
        answers = [answer(tls) for tls in slow]
        assert all(a.startswith(b"HTTP/1.1 200") for a in answers), answers[0][:300]
        assert proxy["arrived"] == [UPLOAD] * 40  # each handed over whole
    finally:
        for tls in slow:
            tls.close()


def test_an_address_past_its_connection_limit_gets_429(proxy):
    held = [slow_upload(proxy, 10) for _ in range(70)]
    try:
        resp = requests.get(f"{proxy['https']}/healthz", verify=proxy["ca"], timeout=10)
        assert resp.status_code == 429
    finally:
        for tls in held:
            tls.close()
