"""SQLAlchemy engine and sessions, one per process.

SQLite (the embedded default) is opened in WAL mode with a busy timeout so that several gunicorn
workers and Celery threads can write at once; PostgreSQL needs nothing special.

On SQLite every transaction starts with ``BEGIN IMMEDIATE`` (SQLAlchemy's recipe for pysqlite,
whose own implicit transactions begin only at the first write and let ``SAVEPOINT``/``RELEASE``
commit on their own): a unit of work is then really atomic (the callback's outbox row and audit
event commit or roll back together), and a transaction that reads before it writes cannot fail
with a stale snapshot, because it holds the single write lock from the start and waits for it
under the busy timeout instead.

Waiting for that lock is SQLite's busy handler, which sleeps in growing steps (up to 100 ms)
and retries: under a burst of callbacks from several gunicorn workers a few unlucky ones waited
over a second. So writers first queue on a file lock (``flock`` beside the database, plus a
thread lock inside the process, since ``flock`` does not tell one process's threads apart): the
kernel wakes a waiter the moment the lock is free, and BEGIN IMMEDIATE then finds SQLite's lock
free. The busy timeout stays as the guard against other programs opening the file.

WAL checkpoints (copying the log back into the database file, with an fsync) ran inside
whichever commit pushed the log past 1,000 pages: that writer, and every writer queued behind
it, waited for the copy (on this machine more than half of a callback batch's commit time). A
thread in each writing process checkpoints instead (``WalCheckpointer``, PASSIVE: it never
blocks a reader or writer), and the commits' own automatic checkpoint is kept only as the
backstop, at 10,000 pages.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from sqlalchemy import BigInteger, DateTime, create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

log = logging.getLogger(__name__)


class Base(DeclarativeBase):
    pass


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


MICROS = Decimal("0.000001")


def to_money(value) -> Decimal:
    """A Decimal rounded to a millionth of the currency unit (what ``Money`` stores)."""
    return Decimal(value).quantize(MICROS, rounding=ROUND_HALF_UP)


class Money(TypeDecorator):
    """A Decimal amount stored as whole millionths in a BIGINT.

    Exact on every backend (SQLite has no decimal type) and ``SUM`` stays an exact integer sum.
    """

    impl = BigInteger
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        return int(to_money(value) / MICROS)

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return (Decimal(int(value)) * MICROS).quantize(MICROS)


def utcnow() -> datetime:
    return datetime.now(UTC)


def make_engine(url: str, **kwargs) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):
            dbapi_connection.isolation_level = None  # we say when transactions begin
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_CHECKPOINT_PAGES}")
            cursor.close()

        on_file = bool(parsed.database and parsed.database != ":memory:")
        queue = WriterQueue(parsed.database) if on_file else None
        checkpointer = WalCheckpointer(parsed.database) if on_file else None

        if checkpointer is not None:
            event.listen(engine, "engine_disposed", lambda _engine: checkpointer.stop())

        @event.listens_for(engine, "begin")
        def _sqlite_begin(connection):
            if queue is not None:
                checkpointer.ensure_running()
                queue.acquire()
            try:
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            except BaseException:
                if queue is not None:
                    queue.release()
                raise

        if queue is not None:
            # Whichever way the transaction ends (commit, rollback, a connection thrown away or
            # returned to the pool mid-transaction), the turn passes on.
            for name in ("commit", "rollback"):
                event.listen(engine, name, lambda _connection: queue.release())
            event.listen(engine, "checkin", lambda _dbapi, _record: queue.release())
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 5)
    kwargs.setdefault("max_overflow", 10)
    kwargs.setdefault("connect_args", {"connect_timeout": 3})
    return create_engine(url, **kwargs)


BACKSTOP_CHECKPOINT_PAGES = 10_000


class WalCheckpointer:
    """Checkpoints a SQLite database's WAL every ``interval_s`` from a thread of this process.

    Started by a write transaction (a forked child starts its own); it leaves after ``idle_s``
    without one, and on ``stop``. Several processes' checkpointers take turns: SQLite runs one
    checkpoint at a time and a PASSIVE one that finds another under way just returns.
    """

    def __init__(self, database: str, interval_s: float = 0.25, idle_s: float = 30.0):
        self.database = database
        self.interval_s = interval_s
        self.idle_s = idle_s
        self._pid: int | None = None
        self._last_write = 0.0
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def ensure_running(self) -> None:
        self._last_write = time.monotonic()
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid() and not self._stopped.is_set():
                threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True).start()
                self._pid = os.getpid()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        connection = sqlite3.connect(self.database, timeout=0, isolation_level=None,
                                     check_same_thread=False)
        try:
            while not self._stopped.wait(self.interval_s):
                try:
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:  # busy or locked this time: the next turn tries again
                    log.debug("WAL checkpoint skipped: %s", exc)
                with self._lock:
                    if time.monotonic() - self._last_write > self.idle_s:
                        self._pid = None
                        return
        finally:
            connection.close()


class WriterQueue:
    """One SQLite transaction at a time across processes (``flock``) and threads (a lock), with
    waiters woken as soon as the holder is done. Releasing when this thread holds nothing is a
    no-op, so every way a transaction can end may release."""

    def __init__(self, database: str):
        self._path = f"{database}.writer-lock"
        self._pid: int | None = None
        self._fd = -1

    def _for_this_process(self) -> None:
        """A forked child starts with its own file description, lock and no holder."""
        if self._pid != os.getpid():
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            self._thread_lock = threading.Lock()
            self._held = threading.local()
            self._pid = os.getpid()

    def acquire(self) -> None:
        self._for_this_process()
        if getattr(self._held, "yes", False):
            return
        self._thread_lock.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise
        self._held.yes = True

    def release(self) -> None:
        if self._pid != os.getpid() or not getattr(self._held, "yes", False):
            return
        self._held.yes = False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()


class Database:
    """An engine plus its session factory."""

    def __init__(self, url: str, **engine_kwargs):
        self.url = url
        self.engine = make_engine(url, **engine_kwargs)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def transaction(self):
        """One unit of work: commit on success, roll back on any error."""
        with self.sessions.begin() as session:
            yield session

    def session(self) -> Session:
        return self.sessions()

    def dispose(self) -> None:
        self.engine.dispose()
