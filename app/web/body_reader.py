"""Read a request body within a total deadline (``REQUEST_BODY_TIMEOUT_S``).

A client that trickles its body a byte at a time would otherwise hold a request thread for as
long as it likes: every socket read returns in time, only the whole never arrives (and
gunicorn's readers loop over reads until they have the size asked for, so a timeout per read
does not bound them). Under gunicorn a watchdog thread shuts the socket for reading when the
deadline passes: the blocked read returns at once, the request gets 408, and gunicorn closes
the connection (its body reader failed) instead of draining the rest. Other servers get the
deadline checked between chunks.

gunicorn.conf.py's worker buffers a ``Content-Length`` body before any thread sees it
(app/web/gunicorn_worker.py), so behind it this matters for chunked bodies; it is the guard for
any other server too.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import itertools
import socket
import tempfile
import threading
import time

from flask import current_app, request
from werkzeug.exceptions import BadRequest, HTTPException, RequestEntityTooLarge, RequestTimeout
from werkzeug.wsgi import LimitedStream

CHUNK = 64 * 1024
GRANULARITY_S = 0.25


class BodyTooSlow(RequestTimeout):
    description = "the request body did not arrive in time"


WATCHING, DONE, FIRED = 0, 1, 2


class Watchdog:
    """Shuts sockets for reading at their deadlines, unless their read finished first."""

    def __init__(self):
        self._heap: list[list] = []  # [deadline, order, socket, state]
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, sock, deadline: float) -> list:
        entry = [deadline, next(self._order), sock, WATCHING]
        with self._changed:
            heapq.heappush(self._heap, entry)
            if self._thread is None:  # started lazily: in the forked worker, not the master
                self._thread = threading.Thread(target=self._run, name="body-deadline", daemon=True)
                self._thread.start()
            if self._heap[0] is entry:
                self._changed.notify()
        return entry

    def done(self, entry: list) -> bool:
        """Stop watching; True when the deadline had fired (the socket is shut for reading)."""
        with self._changed:
            fired = entry[3] == FIRED
            entry[2], entry[3] = None, DONE
            return fired

    def _run(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                while self._heap and (self._heap[0][3] == DONE or self._heap[0][0] <= now):
                    entry = heapq.heappop(self._heap)
                    if entry[3] == WATCHING:
                        entry[3] = FIRED
                        with contextlib.suppress(OSError):
                            entry[2].shutdown(socket.SHUT_RD)
                # At most a few wake-ups a second however many requests come: a deadline is
                # met within GRANULARITY_S, and finished reads leave the heap in batches.
                self._changed.wait(max(self._heap[0][0] - now, GRANULARITY_S) if self._heap else None)


WATCHDOG = Watchdog()


def read_body(limit: int | None = None, timeout_s: float | None = None) -> bytes:
    """The body (at most ``limit`` bytes, else 413), read within ``timeout_s`` (else 408)."""
    if timeout_s is None:
        timeout_s = current_app.extensions["services"].settings.request_body_timeout_s
    if limit is not None and request.content_length is not None and request.content_length > limit:
        raise RequestEntityTooLarge()
    # bounded by Content-Length (or the server's chunked decoding)
    sink = io.BytesIO()
    read_within(request.stream, request.environ.get("gunicorn.socket"), timeout_s, limit, sink)
    return sink.getvalue()


def read_within(stream, sock, timeout_s: float, limit: int | None, sink) -> int:
    """Copy ``stream`` into ``sink`` within ``timeout_s`` (else ``BodyTooSlow``), at most
    ``limit`` bytes (else ``RequestEntityTooLarge``); the bytes copied. ``sock``: gunicorn's
    socket, shut for reading at the deadline so that a blocked read returns."""
    deadline = time.monotonic() + timeout_s
    entry = WATCHDOG.watch(sock, deadline) if sock is not None else None
    size = 0
    try:
        while True:
            chunk = stream.read(CHUNK)
            if not chunk:
                break
            sink.write(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                raise RequestEntityTooLarge()
            if time.monotonic() > deadline:
                if sock is not None:  # else gunicorn would drain the rest of the slow body
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RD)
                raise BodyTooSlow()
    except (RequestEntityTooLarge, BodyTooSlow):
        raise
    except Exception:  # the read the watchdog ended (ClientDisconnected, NoMoreData, ...)
        if entry is not None and WATCHDOG.done(entry):
            raise BodyTooSlow() from None
        raise
    finally:
        if entry is not None:
            WATCHDOG.done(entry)
    return size


BODY_ERROR = "wecom_bot.body_error"
SPOOL_IN_MEMORY = 1024 * 1024  # larger bodies (document uploads) wait on disk


class BodyFirst:
    """WSGI middleware: every request's body read whole, under the deadline, before the app.

    Flask-WTF's CSRF check and form parsing read ``request.form`` with no deadline of their
    own: three trickling POSTs to ``/admin/login`` held three request threads indefinitely, and
    three 10 MB uploads more. Here the body is read within ``REQUEST_BODY_TIMEOUT_S`` into a
    spooled file (memory up to 1 MiB), at most ``limit_for(path)`` bytes (a larger
    Content-Length is refused unread); the app then reads it from there. A body too slow or too
    large is handed to the app as an error in ``environ[BODY_ERROR]``, which ``raise_body_error``
    (the app's first hook) raises, so every route answers it in its own shape (OpenAI's on
    ``/v1``) before anything reads the form."""

    def __init__(self, app, timeout_s: float, limit_for):
        self.app, self.timeout_s, self.limit_for = app, timeout_s, limit_for

    def __call__(self, environ, start_response):
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if chunked or length > 0:
            limit = self.limit_for(environ.get("PATH_INFO", ""))
            if length > limit:
                environ[BODY_ERROR] = RequestEntityTooLarge()
            else:
                # A server's input may be the connection itself (Werkzeug's): read only the body.
                stream = environ["wsgi.input"] if chunked else LimitedStream(environ["wsgi.input"], length)
                self._buffer(environ, stream, limit)
        return self.app(environ, start_response)

    def _buffer(self, environ, stream, limit: int) -> None:
        sink = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115 - the request's
        try:
            size = read_within(stream, environ.get("gunicorn.socket"), self.timeout_s, limit, sink)
        except Exception as exc:  # noqa: BLE001 - any failed read is this request's error
            sink.close()
            environ[BODY_ERROR] = exc if isinstance(exc, HTTPException) else BadRequest(
                "the request body could not be read (the client went away?)")
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(), "0"
            environ.pop("HTTP_TRANSFER_ENCODING", None)
            return
        sink.seek(0)
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = sink, str(size)
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        environ["wsgi.input_terminated"] = False  # now a plain body of CONTENT_LENGTH bytes


def raise_body_error() -> None:
    """Flask's first ``before_request``: the error ``BodyFirst`` met reading the body."""
    error = request.environ.get(BODY_ERROR)
    if error is not None:
        raise error
