"""The web processes' side of the intake server (``app.web.intake_server``), in ``app.intake.wire``'s frames.

A callback's request thread prepares its message, sends it to the server on a connection of its
own (kept for the thread's next requests) and waits for the row. When the server cannot be
reached (not started yet, being restarted by gunicorn after a crash, or not run at all) the
thread writes in-process instead (``app.intake.local.LocalIntake``): a message is never refused for it.

A connection that fails (the server restarted since it was opened) is replaced and the message
sent again; if the server had written it before it went away, the second write finds the row by
its dedup hash (a duplicate, created false) and the sweeper publishes its task. No answer within
``timeout_s`` is ``IntakeUnavailable``: the callback answers 503 and WeCom retries.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from app.intake import wire
from app.intake.local import LocalIntake
from app.intake.protocol import IntakeUnavailable
from app.metrics import counters as metrics
from app.outbox.rows import Accepted, Arrival, Prepared, prepare

log = logging.getLogger(__name__)
WARN_EVERY_S = 30.0


class RemoteIntake:
    def __init__(self, services, path: str, timeout_s: float = 3.0):
        self.services = services
        self.path = path
        self.timeout_s = timeout_s
        self._threads = threading.local()
        self._fallback: LocalIntake | None = None
        self._lock = threading.Lock()
        self._warned_at = 0.0

    def accept(self, arrival: Arrival, fingerprint: str | None = None) -> Accepted:
        """As ``LocalIntake.accept``: the message's row, written with its audit event."""
        return self.accept_prepared(prepare(self.services.blind_index, arrival, fingerprint))

    def accept_prepared(self, prepared: Prepared) -> Accepted:
        deadline = time.monotonic() + self.timeout_s
        frame = wire.request(prepared)
        for _ in range(2):
            sock = self._connection()
            if sock is None:
                break
            try:
                # The socket's own timeout (set once: setting it is a system call that lets go
                # of the GIL) bounds each wait; the deadline bounds the fallback.
                sock.sendall(frame)
                answer = _read_frame(sock)
            except TimeoutError:
                self._forget()
                raise IntakeUnavailable(f"the intake server did not answer within {self.timeout_s:g} s") from None
            except (OSError, ValueError) as exc:
                self._forget()
                self._warn(f"connection lost ({type(exc).__name__})")
                continue
            if isinstance(answer, Accepted):
                return answer
            raise IntakeUnavailable(answer)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise IntakeUnavailable(f"not written within {self.timeout_s:g} s")
        metrics.INTAKE_FALLBACKS.inc()
        return self.fallback.accept_prepared(prepared, remaining)

    @property
    def fallback(self) -> LocalIntake:
        with self._lock:
            if self._fallback is None:
                self._fallback = LocalIntake(self.services, timeout_s=self.timeout_s)
            return self._fallback

    def _connection(self) -> socket.socket | None:
        """This thread's connection to the server, or None when the server cannot be reached."""
        sock = getattr(self._threads, "sock", None)
        if sock is not None and self._threads.pid == os.getpid():
            return sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            self._warn(f"unreachable ({exc.strerror or type(exc).__name__})")
            return None
        self._threads.sock, self._threads.pid = sock, os.getpid()
        return sock

    def _forget(self) -> None:
        sock = getattr(self._threads, "sock", None)
        self._threads.sock = None
        if sock is not None:
            sock.close()

    def _warn(self, what: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("intake server at %s %s: writing in this process meanwhile", self.path, what)


def _read_frame(sock: socket.socket) -> Accepted | str:
    """One answer; mostly a single ``recv`` (each is a system call that lets go of the GIL)."""
    buffer = bytearray()
    data = sock.recv(4096)
    while True:
        if not data:
            raise ConnectionResetError("the intake server closed the connection")
        buffer += data
        frames = wire.split(buffer)
        if frames:
            return wire.read_answer(frames[0])
        data = sock.recv(65536)
