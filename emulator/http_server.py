"""A keep-alive, threaded WSGI server for the stand-ins: the emulator and the test model servers.

WeCom's API and model servers keep HTTP connections alive, so the worker's pooled sessions send
call after call on one connection. werkzeug's development server answers every request with
``Connection: close``, which made each of the worker's calls open a new connection (about a
third more client CPU a call), a cost production never pays. waitress speaks HTTP/1.1 with
keep-alive and streams each written chunk at once (``send_bytes`` 1, its default), which the
model stand-in's server-sent events need.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable

from waitress import wasyncore
from waitress.server import create_server

THREADS = 64  # requests served at once: slow faults and the stub model's delay hold a thread
CONNECTION_LIMIT = 1000  # waitress's default (100) is below a load test's pooled connections


def access_logged(app: Callable, log: logging.Logger) -> Callable:
    """``app`` with an access log line a request, the path without its query string (WeCom's
    queries carry ``corpsecret`` and ``access_token``)."""

    def logged(environ: dict, start_response: Callable) -> Iterable[bytes]:
        def start(status: str, headers: list, exc_info=None):
            log.info('"%s %s" %s', environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"),
                     status.split(" ", 1)[0])
            return start_response(status, headers, exc_info)

        return app(environ, start)

    return logged


LOOP_TIMEOUT = 0.5  # seconds a poll waits: how soon the loop sees `stop` if nothing wakes it


class WSGIServer:
    """``app`` served on ``host:port`` (0 picks a free port, known as ``port`` at once).

    ``serve_forever()`` blocks (a KeyboardInterrupt ends it); ``start()`` serves on a daemon
    thread and ``stop()`` closes every connection, ends that thread and the request threads.
    The serving loop is ours, not waitress's ``run()``: it ends when ``stop`` sets its flag and
    closes the listening socket and every connection itself, so no poll meets a closed
    descriptor, and a stop never depends on waitress's wake-up pipe (a CI run once found that
    pipe already closed at stop: writing to it raised EBADF).
    """

    def __init__(self, app: Callable, host: str, port: int, *, threads: int = THREADS,
                 name: str = "wsgi"):
        self.name = name
        if host == "localhost":  # one listening socket (not one a resolved address), one loop
            host = "127.0.0.1"
        self._server = create_server(
            app, host=host, port=port, threads=threads, connection_limit=CONNECTION_LIMIT,
            asyncore_use_poll=True, ident=name,
            clear_untrusted_proxy_headers=True)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def port(self) -> int:
        return int(self._server.effective_port)

    def serve_forever(self) -> None:
        connections = self._server._map  # the listening socket, the wake-up pipe, the connections
        try:
            while not self._stopping.is_set() and connections:
                wasyncore.loop(timeout=LOOP_TIMEOUT, use_poll=True, map=connections, count=1)
        finally:
            wasyncore.close_all(connections, ignore_all=True)

    def start(self) -> WSGIServer:
        self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """End the serving loop (which closes the listening socket and every connection in its
        own thread), then wait for the request threads."""
        server = self._server
        self._stopping.set()
        if self._thread is not None and self._thread.is_alive():
            if not server.trigger._closed:  # wake the poll now rather than at its timeout
                with contextlib.suppress(OSError):
                    server.trigger.pull_trigger()
            self._thread.join(timeout)
        if server._map:  # never served, or the loop did not end in time
            wasyncore.close_all(server._map, ignore_all=True)
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=timeout)
