"""app.http.pool: the worker's JSON calls on urllib3, with the environment's proxy, CA bundle
and .netrc read once (as app.http.session does for requests), kept-alive connections, no
redirects, errors that never carry the URL, and streamed lines as they arrive."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3

from app.http.pool import HttpPool, HttpTimeout, HttpUnreachable, iter_lines

BASE = "https://qyapi.weixin.qq.com"


def _clear(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                 "all_proxy", "no_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NETRC"):
        monkeypatch.delenv(name, raising=False)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as WeCom and the model servers

    def log_message(self, *_):
        pass

    def do_POST(self):  # noqa: N802 - http.server's name
        self.server.ports.add(self.client_address[1])
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.startswith("/slow"):
            time.sleep(1.0)
        if self.path.startswith("/moved"):
            self.send_response(302)
            self.send_header("Location", "http://example.invalid/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (b"data: one\n\n", b"data: t", b"wo\r\n\r\n"):
                self.server.sent.append(piece)  # before the write: the client may read it first
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
                self.server.gate.wait(5)
            self.wfile.write(b"0\r\n\r\n")
            return
        answer = json.dumps({"echo": json.loads(body), "path": self.path,
                             "auth": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.ports, httpd.sent, httpd.gate = set(), [], threading.Event()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd, f"http://127.0.0.1:{httpd.server_port}"
    httpd.gate.set()
    httpd.shutdown()
    httpd.server_close()


def test_json_calls_share_one_kept_alive_connection(monkeypatch, server):
    _clear(monkeypatch)
    httpd, url = server
    pool = HttpPool(url)
    for n in range(5):
        answer = pool.post_json(f"{url}/api", {"n": n, "text": "你好"}, timeout=(1, 2))
        assert answer.status == 200
        assert answer.json()["echo"] == {"n": n, "text": "你好"}
    assert len(httpd.ports) == 1
    assert pool.request("POST", f"{url}/api", params={"access_token": "t k"}, body=b"{}",
                        timeout=2).json()["path"] == "/api?access_token=t+k"


def test_a_redirect_is_an_answer_not_followed(monkeypatch, server):
    _clear(monkeypatch)
    _, url = server
    assert HttpPool(url).post_json(f"{url}/moved", {}, timeout=2).status == 302


def test_errors_say_what_happened_and_never_the_url(monkeypatch, server):
    _clear(monkeypatch)
    _, url = server
    pool = HttpPool(url)
    with pytest.raises(HttpTimeout) as timeout:
        pool.post_json(f"{url}/slow?access_token=SECRET", {}, timeout=(1, 0.2))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(HttpUnreachable) as refused:
        HttpPool(closed).post_json(f"{closed}/x?access_token=SECRET", {}, timeout=1)
    for error in (timeout, refused):
        assert "SECRET" not in str(error.value) and "127.0.0.1" not in str(error.value)
        assert error.value.__cause__ is None and error.value.__suppress_context__


def test_streamed_lines_come_as_they_arrive(monkeypatch, server):
    _clear(monkeypatch)
    httpd, url = server
    response = HttpPool(url).post_json(f"{url}/stream", {}, timeout=(1, 5), stream=True)
    lines = iter_lines(response)
    assert next(lines) == "data: one"  # while the server still holds the rest back
    assert len(httpd.sent) == 1
    httpd.gate.set()
    assert list(lines) == ["", "data: two", ""]


def test_the_proxies_of_the_environment_apply(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    pool = HttpPool(BASE)._pool
    assert isinstance(pool, urllib3.ProxyManager) and pool.proxy.host == "proxy.example"
    monkeypatch.setenv("no_proxy", "qyapi.weixin.qq.com")
    assert not isinstance(HttpPool(BASE)._pool, urllib3.ProxyManager)


def test_the_ca_bundle_and_netrc_of_the_environment_apply(monkeypatch, tmp_path, server):
    _clear(monkeypatch)
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    assert HttpPool(BASE)._pool.connection_pool_kw["ca_certs"] == str(bundle)
    _, url = server
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login bot password pw\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert HttpPool(url).post_json(f"{url}/api", {}, timeout=2).json()["auth"] == "Basic Ym90OnB3"
