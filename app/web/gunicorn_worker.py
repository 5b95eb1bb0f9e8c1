"""gunicorn's gthread worker, reading each request whole before a thread sees it.

Stock gthread hands a connection to a thread as soon as its first bytes arrive; the thread then
waits on the rest of the head and on the body. A client trickling its upload holds that thread,
and about one slow client per thread starves the process: ``/healthz`` included. Here the
worker's event loop (one thread, non-blocking sockets, as nginx does) collects the head and a
``Content-Length`` body first, and only a complete request goes to the thread pool. A slow
client then costs a buffer and a socket, never a thread; it gets 408 and is closed once
``REQUEST_BODY_TIMEOUT_S`` has passed since its request began.

A chunked body is collected the same way (``ChunkScanner`` finds its end as it arrives): three
trickling chunked logins held three threads for as long as their clients liked, since Flask-WTF
parses the form without any deadline.

Handed over at once, unbuffered (the app's own deadline, app/web/body_reader.py, bounds them):
``Expect: 100-continue`` (the client waits for the answer before its body), bodies larger than
``BUFFER_MAX`` (a document upload; the app refuses others by their length, unread), heads that
do not parse and malformed chunking (gunicorn answers them), and TLS served by gunicorn itself
(nginx terminates it here).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import deque
from functools import partial

from gunicorn.workers import gthread

BUFFER_MAX = 2 * 1024 * 1024  # nginx's client_max_body_size; API_MAX_BODY_BYTES is 1 MiB
HEAD_MAX = 64 * 1024
SLOW_BODY = b"the request body did not arrive in time"
TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: text/plain\r\n"
             b"Content-Length: %d\r\n\r\n%s" % (len(SLOW_BODY), SLOW_BODY))
_LENGTH = re.compile(rb"^content-length:[ \t]*(\d{1,12})[ \t]*\r?$", re.I | re.M)
_CHUNKED = re.compile(rb"^transfer-encoding:[ \t]*chunked[ \t]*\r?$", re.I | re.M)
_HANDS_OVER = re.compile(rb"^(transfer-encoding|expect):", re.I | re.M)
CHUNKED = -2


def wanted(buf: bytes) -> int | None:
    """How many bytes the request starting ``buf`` has in all; -1: its head is still arriving;
    ``CHUNKED``: a chunked body follows the head; None: hand it over as it is."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None if len(buf) > HEAD_MAX else -1
    head = buf[:end + 2]
    lengths = _LENGTH.findall(head)
    if len(_HANDS_OVER.findall(head)) == 1 and len(_CHUNKED.findall(head)) == 1 and not lengths:
        return CHUNKED
    if _HANDS_OVER.search(head) or len(lengths) > 1:
        return None
    length = int(lengths[0]) if lengths else 0
    return None if length > BUFFER_MAX else end + 4 + length


class ChunkScanner:
    """Where a chunked body ends, found over its bytes as they arrive (each call goes on from
    the last whole chunk, so a trickled body is not scanned again from its start)."""

    SIZE_LINE_MAX = 1024  # a size and its extensions

    def __init__(self, body_start: int):
        self.pos = body_start
        self.in_trailers = False

    def end(self, buf: bytearray) -> int | None:
        """The offset just past the body; -1: not all here yet; None: malformed."""
        while True:
            eol = buf.find(b"\r\n", self.pos)
            if eol < 0:
                limit = HEAD_MAX if self.in_trailers else self.SIZE_LINE_MAX
                return -1 if len(buf) - self.pos <= limit else None
            if self.in_trailers:
                if eol == self.pos:
                    return eol + 2
                self.pos = eol + 2
                continue
            size = bytes(buf[self.pos:eol]).split(b";", 1)[0].strip()
            if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                return None
            length = int(size, 16)
            if length == 0:
                self.in_trailers, self.pos = True, eol + 2
                continue
            data_end = eol + 2 + length
            if data_end + 2 > len(buf):
                return -1
            if buf[data_end:data_end + 2] != b"\r\n":
                return None
            self.pos = data_end + 2


class Pending:
    """A connection whose request is still arriving."""

    def __init__(self, conn, deadline: float):
        self.conn = conn
        self.deadline = deadline
        self.buf = bytearray()
        self.registered = False
        self.chunks: ChunkScanner | None = None


class BufferingThreadWorker(gthread.ThreadWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.arriving: deque[Pending] = deque()  # in deadline order: one fixed timeout for all
        self.body_timeout_s = 10.0

    def init_process(self):
        from app.config import ConfigError, get_settings

        with contextlib.suppress(ConfigError):  # loading the app reports it
            self.body_timeout_s = get_settings().request_body_timeout_s
        super().init_process()  # runs the event loop

    def accept(self, listener):
        if self.cfg.is_ssl:
            return super().accept(listener)
        try:
            client, address = listener.accept()
        except OSError as exc:
            if exc.errno not in (gthread.errno.EAGAIN, gthread.errno.ECONNABORTED,
                                 gthread.errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        self.collect(gthread.TConn(self.cfg, client, address, listener.getsockname()))

    def on_client_socket_readable(self, conn, client):
        """A kept-alive connection's next request: collected like a new one."""
        if self.cfg.is_ssl:
            return super().on_client_socket_readable(conn, client)
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self.collect(conn)

    def collect(self, conn) -> None:
        conn.sock.setblocking(False)
        pending = Pending(conn, time.monotonic() + self.body_timeout_s)
        if self.read_some(pending):
            pending.registered = True
            self.arriving.append(pending)
            self.poller.register(conn.sock, gthread.selectors.EVENT_READ,
                                 partial(self.on_arriving, pending))

    def on_arriving(self, pending: Pending, _sock) -> None:
        if not self.read_some(pending):
            self.arriving.remove(pending)

    def read_some(self, pending: Pending) -> bool:
        """Read what has arrived; hand over or close when done. True: still arriving."""
        while True:
            try:
                data = pending.conn.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                data = b""
            if not data:  # the client went away before its request was whole
                self.drop(pending)
                return False
            pending.buf += data
            if self.complete(pending):
                self.hand_over(pending)
                return False

    @staticmethod
    def complete(pending: Pending) -> bool:
        """Whether to hand the request over now: it is whole, or not ours to collect."""
        if pending.chunks is None:
            need = wanted(bytes(pending.buf[:HEAD_MAX + 4]))
            if need != CHUNKED:
                return need is None or (need >= 0 and len(pending.buf) >= need)
            pending.chunks = ChunkScanner(pending.buf.find(b"\r\n\r\n") + 4)
        end = pending.chunks.end(pending.buf)
        return end is None or end >= 0 or len(pending.buf) > BUFFER_MAX

    def hand_over(self, pending: Pending) -> None:
        if pending.registered:
            self.poller.unregister(pending.conn.sock)
        conn = pending.conn
        conn.prebuffer = bytes(pending.buf)
        conn.data_ready = True  # no need to wait for data in the thread
        self.enqueue_req(conn)

    def drop(self, pending: Pending, answer: bytes = b"") -> None:
        if pending.registered:
            self.poller.unregister(pending.conn.sock)
        if answer:
            with contextlib.suppress(OSError):
                pending.conn.sock.send(answer)
        self.nr_conns -= 1
        pending.conn.close()

    def murder_pending(self):
        """Also answer 408 to requests still arriving past their deadline."""
        super().murder_pending()
        now = time.monotonic()
        while self.arriving and self.arriving[0].deadline <= now:
            self.drop(self.arriving.popleft(), TIMED_OUT)

    def handle(self, conn):
        """Give the parser the bytes read in the event loop before it reads the socket."""
        buffered = conn.__dict__.pop("prebuffer", None)
        if buffered:
            conn.sock.setblocking(True)
            conn.init()  # the HTTP/1 parser (no TLS here)
            conn.parser.unreader.unread(buffered)
        return super().handle(conn)
