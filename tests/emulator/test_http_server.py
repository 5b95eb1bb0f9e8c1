"""The stand-ins' HTTP server: keep-alive like WeCom's, chunks streamed as written, a clean stop."""

from __future__ import annotations

import http.client
import logging
import socket
import threading

import pytest

from emulator.http_server import WSGIServer, access_logged


def _remote_port(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [environ["REMOTE_PORT"].encode()]


@pytest.fixture
def served():
    servers = []

    def serve(app):
        server = WSGIServer(app, "127.0.0.1", 0, name="test-wsgi").start()
        servers.append(server)
        return server

    yield serve
    for server in servers:
        server.stop()


def test_calls_share_one_connection(served):
    server = served(_remote_port)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    ports = []
    for _ in range(3):
        conn.request("GET", "/")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Connection") != "close"
        ports.append(resp.read())
    conn.close()
    assert len(set(ports)) == 1  # the client's one socket served all three


def test_each_chunk_reaches_the_client_as_it_is_written(served):
    go_on = threading.Event()

    def stream(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        yield b"data: first\n\n"
        assert go_on.wait(5)
        yield b"data: second\n\n"

    server = served(stream)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/")
    resp = conn.getresponse()
    assert resp.read1() == b"data: first\n\n"  # before the app has written the rest
    go_on.set()
    assert resp.read() == b"data: second\n\n"
    conn.close()


def test_stop_closes_open_connections_and_the_port(served):
    server = served(_remote_port)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/")
    conn.getresponse().read()
    server.stop()
    assert not server._thread.is_alive()
    assert conn.sock.recv(1) == b""  # the idle keep-alive connection was closed
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)


def test_access_log_leaves_out_the_query(served, caplog):
    caplog.set_level(logging.INFO, "test.access")
    server = served(access_logged(_remote_port, logging.getLogger("test.access")))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/cgi-bin/gettoken?corpid=c&corpsecret=SECRET-1")
    conn.getresponse().read()
    conn.close()
    assert '"GET /cgi-bin/gettoken" 200' in caplog.text
    assert "SECRET-1" not in caplog.text
