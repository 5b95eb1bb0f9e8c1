"""Read a request body within a total deadline (``REQUEST_BODY_TIMEOUT_S``).

A client that trickles its body a byte at a time would otherwise hold a request thread for as
long as it likes: every socket read returns in time, only the whole never arrives (and
gunicorn's readers loop over reads until they have the size asked for, so a timeout per read
does not bound them). Under gunicorn a watchdog thread shuts the socket for reading when the
deadline passes: the blocked read returns at once, the request gets 408, and gunicorn closes
the connection (its body reader failed) instead of draining the rest. Other servers get the
deadline checked between chunks.

gunicorn.conf.py's worker buffers a ``Content-Length`` body before any thread sees it
(app/gunicorn_worker.py), so behind it this matters for chunked bodies; it is the guard for
any other server too.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time

from flask import current_app, request
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

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
    stream = request.stream  # bounded by Content-Length (or the server's chunked decoding)
    deadline = time.monotonic() + timeout_s
    sock = request.environ.get("gunicorn.socket")
    entry = WATCHDOG.watch(sock, deadline) if sock is not None else None
    parts: list[bytes] = []
    size = 0
    try:
        while True:
            chunk = stream.read(CHUNK)
            if not chunk:
                break
            parts.append(chunk)
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
    return b"".join(parts)
