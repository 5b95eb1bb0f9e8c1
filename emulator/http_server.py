"""A keep-alive, threaded WSGI server for the stand-ins: the emulator and the test model servers.

WeCom's API and model servers keep HTTP connections alive, so the worker's pooled sessions send
call after call on one connection. werkzeug's development server answers every request with
``Connection: close``, which made each of the worker's calls open a new connection (about a
third more client CPU a call), a cost production never pays. waitress speaks HTTP/1.1 with
keep-alive and streams each written chunk at once (``send_bytes`` 1, its default), which the
model stand-in's server-sent events need.
"""

from __future__ import annotations

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


class WSGIServer:
    """``app`` served on ``host:port`` (0 picks a free port, known as ``port`` at once).

    ``serve_forever()`` blocks (a KeyboardInterrupt ends it); ``start()`` serves on a daemon
    thread and ``stop()`` closes every connection, ends that thread and the request threads.
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

    @property
    def port(self) -> int:
        return int(self._server.effective_port)

    def serve_forever(self) -> None:
        self._server.run()

    def start(self) -> WSGIServer:
        self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listening socket and every connection from the serving thread itself (the
        trigger runs the close there, so no poll() meets a closed descriptor), then wait for the
        request threads."""
        server = self._server
        if self._thread is not None and self._thread.is_alive():
            server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
            self._thread.join(timeout)
        else:
            wasyncore.close_all(server._map)
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=timeout)
