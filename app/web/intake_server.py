"""The intake server: the callbacks' group commit in one process for the whole web service.

With a writer thread in every web process (``app.intake.local.LocalIntake``), each process wrote its own
small batches, SQLite's single write lock passed between processes for every one, and the
writer held that lock while waiting for a GIL its own request threads were holding. Here one
single-threaded loop takes the prepared messages of every web process over a Unix socket,
writes all that are waiting in one transaction (``app.intake.local.BatchWriter``), answers each and
hands the new rows' tasks to a publisher thread. Nothing else runs in the process, so a batch's
transaction is never held up by anything but the database.

gunicorn runs it (``gunicorn.conf.py``) as its one *dirty worker*: gunicorn starts it with the
web service, starts it again if it dies, and stops it with the service. The web processes find
it at ``INTAKE_SOCKET`` (``app.intake.client``) and, while it cannot be reached, write in-process.

The protocol is ``app.intake.wire``'s frames. The socket's directory is the service user's alone
(mode 0700, the socket 0600).

Lingering: a batch waits up to ``linger_s`` for more requests while other connections sent one
within the last ``ACTIVE_S`` and new ones keep coming (like PostgreSQL's ``commit_delay`` with
``commit_siblings``), since a commit costs about as much as the next several messages' rows. A
lone client never waits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time

from gunicorn.dirty.app import DirtyApp

from app.intake import wire
from app.intake.batching import BatchThread
from app.intake.local import BatchWriter, new_tasks
from app.outbox.publisher import publish_tasks
from app.outbox.rows import Accepted, Prepared

log = logging.getLogger(__name__)

ACTIVE_S = 0.02  # a connection that sent within this long is likely to send again soon
LINGER_REST = 64  # batches written without lingering after lingering gathered nothing


class _Connection:
    __slots__ = ("sock", "inbox", "outbox", "last_request")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.last_request = 0.0


class IntakeServer:
    def __init__(self, services, path: str, max_batch: int = 256, linger_s: float = 0.001):
        self.services = services
        self.path = path
        self.max_batch = max_batch
        self.linger_s = linger_s
        self.writer = BatchWriter(services)
        # Each item is one batch's new tasks: they go out together with the batches waiting, on
        # a Redis client of the publisher thread's own.
        self._broker = services.publisher.broker_client()
        self.publisher = BatchThread("intake-publish", self._publish, 64)
        self.stats = {"batches": 0, "messages": 0, "connections": 0}
        self._selector = selectors.DefaultSelector()
        self._connections: dict[int, _Connection] = {}
        self._pending: list[tuple[_Connection, Prepared | None, str | None]] = []
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._listener: socket.socket | None = None
        self._fruitless = 0
        self._linger_rest = 0

    # -- life ----------------------------------------------------------------------------------
    def listen(self, wait_s: float = 10.0) -> None:
        """Bind the socket. One that a live server answers on is not taken over: it is waited
        for up to ``wait_s`` (gunicorn's reload starts the new worker before it stops the old)."""
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, mode=0o700, exist_ok=True)
        deadline = time.monotonic() + wait_s
        while os.path.exists(self.path) and _answers(self.path):
            if time.monotonic() >= deadline:
                raise RuntimeError(f"an intake server already listens on {self.path}")
            time.sleep(0.2)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old_umask)
        listener.listen(4096)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, None)
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        log.info("intake server listening on %s", self.path)

    def serve(self) -> None:
        if self._listener is None:
            self.listen()
        try:
            while not self._stopping.is_set():
                self._poll(None if not self._pending else 0)
                if self._pending:
                    self._linger()
                    self._write_pending()
        finally:
            self._close()

    def stop(self) -> None:
        """Leave the loop after the batch under way (called from another thread)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _close(self) -> None:
        if not self.publisher.flush(5.0):
            log.warning("intake server stopping: tasks not published within 5 s are left to the sweeper")
        stats = self.stats
        log.info("intake server stopping: %d messages in %d batches (%.1f a batch), %d connections",
                 stats["messages"], stats["batches"], stats["messages"] / max(stats["batches"], 1),
                 stats["connections"])
        for connection in list(self._connections.values()):
            self._drop(connection)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- reading -------------------------------------------------------------------------------
    def _poll(self, timeout: float | None) -> None:
        for key, events in self._selector.select(timeout):
            if key.data is None:
                self._accept()
            elif key.data == "wake":
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 64)
            elif events & selectors.EVENT_WRITE:
                self._flush(key.data)
            else:
                self._receive(key.data)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the clients fall back, log and go on
                log.warning("intake server cannot accept: %s", exc)
                return
            sock.setblocking(False)
            connection = _Connection(sock)
            self._connections[sock.fileno()] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)
            self.stats["connections"] += 1

    def _receive(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)
            return
        connection.inbox += data
        try:
            frames = wire.split(connection.inbox)
        except wire.FrameError as exc:
            log.warning("intake server: dropping a connection that sent a %s", exc)
            self._drop(connection)
            return
        if frames:
            connection.last_request = time.monotonic()
        for frame in frames:
            try:
                self._pending.append((connection, wire.read_request(frame), None))
            except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
                self._pending.append((connection, None, f"bad request: {exc}"))

    def _linger(self) -> None:
        """Wait a little for the requests that other busy connections are about to send.

        Requests spread over connections (a web process's threads take turns), so a connection
        that sent recently is only a hint: the wait ends when a quarter of ``linger_s`` passes
        without a new request, and lingering that gathers nothing three times in a row is left
        off for the next ``LINGER_REST`` batches, then tried again."""
        if self.linger_s <= 0:
            return
        if self._linger_rest:
            self._linger_rest -= 1
            return
        before = len(self._pending)
        deadline = time.monotonic() + self.linger_s
        gap = self.linger_s / 4
        while len(self._pending) < self.max_batch:
            now = time.monotonic()
            waiting = {id(connection) for connection, _, _ in self._pending}
            siblings = any(id(c) not in waiting and now - c.last_request < ACTIVE_S
                           for c in self._connections.values())
            if not siblings or now >= deadline:
                break
            had = len(self._pending)
            self._poll(min(deadline - now, gap))
            if len(self._pending) == had:  # nothing came within the gap: the rest is far off
                break
        if len(self._pending) > before:
            self._fruitless = 0
        else:
            self._fruitless += 1
            if self._fruitless >= 3:
                self._fruitless, self._linger_rest = 0, LINGER_REST

    # -- writing -------------------------------------------------------------------------------
    def _write_pending(self) -> None:
        batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
        prepared = [p for _, p, _ in batch if p is not None]
        outcomes = self.writer.write(prepared) if prepared else []
        self.stats["batches"] += 1
        self.stats["messages"] += len(batch)
        written = iter(outcomes)
        for connection, p, refusal in batch:
            outcome = next(written) if p is not None else None
            if isinstance(outcome, Accepted):
                self._send(connection, wire.answer(outcome, ""))
            else:
                self._send(connection, wire.answer(None, refusal or f"not written: {type(outcome).__name__}"))
        tasks = new_tasks(prepared, outcomes)
        if tasks:
            self.publisher.put(tasks)

    def _publish(self, batches: list[list[tuple[int, str | None]]]) -> None:
        publish_tasks(self.services.publisher, [task for tasks in batches for task in tasks], self._broker)

    def _send(self, connection: _Connection, frame: bytes) -> None:
        if connection.sock.fileno() < 0:  # dropped while its request was written: WeCom retries
            return
        if connection.outbox:
            connection.outbox += frame
            return
        try:
            sent = connection.sock.send(frame)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(connection)
            return
        if sent < len(frame):
            connection.outbox += frame[sent:]
            self._selector.modify(connection.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, connection)

    def _flush(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(connection)
            return
        del connection.outbox[:sent]
        if not connection.outbox:
            self._selector.modify(connection.sock, selectors.EVENT_READ, connection)

    def _drop(self, connection: _Connection) -> None:
        if connection.sock.fileno() < 0:
            return
        self._connections.pop(connection.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.sock)
        connection.sock.close()


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


class IntakeApp(DirtyApp):
    """The server as gunicorn's dirty app (``dirty_apps`` in gunicorn.conf.py): ``init`` starts
    it on a thread of the dirty worker (whose own loop answers gunicorn), ``close`` stops it.
    The server dying for any reason takes the worker with it, so that gunicorn starts a new one.
    Its one action, ``stats``, says what it has done."""

    workers = 1

    def init(self) -> None:
        from app import logging_setup
        from app.config import get_settings
        from app.services import Services

        settings = get_settings()
        logging_setup.configure(settings)
        if not settings.intake_socket:
            raise RuntimeError("INTAKE_SOCKET is not set: gunicorn.conf.py sets it for the intake server")
        self.server = IntakeServer(Services(settings), settings.intake_socket,
                                   linger_s=settings.intake_linger_ms / 1000)
        self.server.listen()
        self.thread = threading.Thread(target=self._serve, name="intake-server", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.server.serve()
        except BaseException:
            log.exception("intake server failed")
        if not self.server._stopping.is_set():
            os._exit(1)

    def __call__(self, action: str, *args, **kwargs):
        if action == "stats":
            return dict(self.server.stats)
        raise ValueError(f"unknown action {action!r}")

    def close(self) -> None:
        self.server.stop()
        self.thread.join(10)
