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

import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
import time
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from sqlalchemy import BigInteger, DateTime, create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

from app import pg_liveness

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


# What a BIGINT of millionths holds. NaN, Infinity and amounts past this have no stored form:
# they once reached the driver (or Decimal's own context) and came back as a 500.
MAX_MONEY = Decimal(2**63 - 1) * MICROS
# The largest row id a 64-bit column holds: a longer number in a URL or query is no row of ours.
MAX_ROW_ID = 2**63 - 1


def to_money(value) -> Decimal:
    """A Decimal rounded to a millionth of the currency unit (what ``Money`` stores); ValueError
    for a value with no stored form (not finite, or beyond a BIGINT of millionths)."""
    try:
        amount = Decimal(value)
    except ArithmeticError:  # decimal.InvalidOperation: not a number at all
        raise ValueError(f"not an amount: {value!r}") from None
    if not amount.is_finite() or abs(amount) > MAX_MONEY:
        raise ValueError(f"amount out of range: {value!r}")
    return amount.quantize(MICROS, rounding=ROUND_HALF_UP)


def row_id(text: str) -> int:
    """A positive row id from a query string (``request.args.get(..., type=row_id)``)."""
    value = int(text)
    if not 0 < value <= MAX_ROW_ID:
        raise ValueError("not a row id")
    return value


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
    # A failed statement's message (logged with its traceback) would otherwise carry the bound
    # values: ciphertexts, blind indexes, password hashes, API-key digests.
    kwargs.setdefault("hide_parameters", True)
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
            read_only = bool(connection.get_execution_options().get(READ_ONLY))
            pooled = connection.connection
            if pooled.info.get(READ_ONLY, False) != read_only:  # switched only when it changes
                connection.exec_driver_sql(f"PRAGMA query_only={int(read_only)}")
                pooled.info[READ_ONLY] = read_only
            if read_only:
                # A WAL reader: its snapshot neither waits for the writer nor holds one up, so
                # a long read (a streamed export to a slow client) leaves the callbacks alone;
                # query_only makes a write through it an error instead of a queue-jumper.
                connection.exec_driver_sql("BEGIN")
                return
            owner = pooled.dbapi_connection
            if queue is not None:
                checkpointer.ensure_running()
                queue.acquire(owner)
            try:
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            except BaseException:
                if queue is not None:
                    queue.release(owner)
                raise

        if queue is not None:
            # Whichever way the transaction ends (commit, rollback, its connection returned to
            # the pool, invalidated or closed, on whatever thread), the turn passes on.
            for name in ("commit", "rollback"):
                event.listen(engine, name, lambda connection: queue.release(_dbapi_of(connection)))
            for name in ("checkin", "invalidate", "close"):
                event.listen(engine.pool, name, lambda dbapi, *_rest: queue.release(dbapi))
            engine.writer_queue = queue  # for a diagnosis when a write waited in vain
        return engine
    # psycopg connections are checked at checkout without a round trip (app/pg_liveness.py);
    # another driver gets SQLAlchemy's SELECT 1 before every use.
    liveness = parsed.get_driver_name() == "psycopg" and "pool_pre_ping" not in kwargs
    kwargs.setdefault("pool_pre_ping", not liveness)
    kwargs.setdefault("pool_size", 5)
    kwargs.setdefault("max_overflow", 10)
    kwargs.setdefault("connect_args", {"connect_timeout": 3})
    engine = create_engine(url, **kwargs)
    if liveness:
        pg_liveness.install(engine)
    return engine


BACKSTOP_CHECKPOINT_PAGES = 10_000
READ_ONLY = "wecom_bot_read_only"  # execution option of ``Database.reader`` sessions


def _dbapi_of(connection):
    """The DBAPI connection under ``connection``; None once invalidated (asking would reconnect,
    and the pool's ``invalidate`` event has released its turn already)."""
    return None if connection.invalidated else connection.connection.dbapi_connection


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


_SETUP_LOCK = threading.Lock()  # a WriterQueue's first use in a process; brief, never nested


def _new_setup_lock() -> None:  # a fork may copy it held by a thread the child does not have
    global _SETUP_LOCK
    _SETUP_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_setup_lock)


class WriterQueue:
    """One SQLite transaction at a time across processes (``flock``) and threads (a lock), with
    waiters woken as soon as the holder is done.

    The turn belongs to a connection, not to a thread: it passes on when that connection's
    transaction ends, even where the end is seen on another thread (a connection returned to
    the pool by the garbage collector). Releasing for a connection that does not hold the turn
    is a no-op, so every way a transaction can end may release. A second transaction that the
    holding thread opens on another connection goes straight to SQLite, whose busy timeout
    then decides (it cannot queue behind its own thread). The holder writes who it is into the
    lock file (``holder``), so a wait that ends in vain can say what it waited for.
    """

    WARN_AFTER_S = 10.0

    def __init__(self, database: str):
        self._path = f"{database}.writer-lock"
        self._pid: int | None = None
        self._fd = -1

    def _for_this_process(self) -> None:
        """A forked child starts with its own file description, lock and no holder. Threads that
        write first at the same moment set it up once: each opening a lock file description of
        its own, they wedged the process (the loser flock-waited on the winner's, forever)."""
        if self._pid == os.getpid():
            return
        with _SETUP_LOCK:
            if self._pid == os.getpid():
                return
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            self._thread_lock = threading.Lock()
            self._release_lock = threading.Lock()  # one release per turn, whichever thread sees it
            self._owner = None
            self._owner_thread: int | None = None
            self._owner_name = ""
            self._owner_since = 0.0
            self._pid = os.getpid()  # last: another thread that sees it finds all of it set

    def acquire(self, owner) -> None:
        self._for_this_process()
        if self._owner_thread == threading.get_ident():
            return  # nested on this thread: see the class docstring
        while not self._thread_lock.acquire(timeout=self.WARN_AFTER_S):
            log.warning("SQLite writer turn: waited %.0f s more; held in this process by thread "
                        "%r for %.1f s", self.WARN_AFTER_S, self._owner_name,
                        time.monotonic() - self._owner_since)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise
        thread = threading.current_thread()
        self._owner, self._owner_thread, self._owner_name = owner, thread.ident, thread.name
        self._owner_since = time.monotonic()
        with contextlib.suppress(OSError):  # the note is for people; the lock does not need it
            note = f"pid {os.getpid()} thread {thread.name!r} since {time.time():.3f}\n".encode()
            os.pwrite(self._fd, note.ljust(96), 0)

    def held_by_this_thread(self) -> bool:
        """Whether this thread holds the turn: a write transaction of its own is open."""
        return self._pid == os.getpid() and self._owner_thread == threading.get_ident()

    def release(self, owner) -> None:
        if self._pid != os.getpid() or owner is None or self._owner is not owner:
            return
        with self._release_lock:
            if self._owner is not owner:
                return
            self._owner, self._owner_thread = None, None
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                self._thread_lock.release()

    def holder(self) -> str:
        """Who holds the turn now, as the holder wrote it, and for how long; or "nobody"."""
        try:
            probe = os.open(self._path, os.O_RDWR)
        except OSError as exc:
            return f"unknown ({type(exc).__name__})"
        try:
            try:  # a description of our own: our process's hold counts as taken too
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                note = os.pread(probe, 96, 0).decode(errors="replace").strip()
                head, _, since = note.rpartition(" since ")
                try:
                    return f"{head} for {time.time() - float(since):.1f} s"
                except ValueError:
                    return note or "unknown"
            return "nobody"
        finally:
            os.close(probe)  # drops the probe's lock too


class Database:
    """An engine plus its session factory, and optionally a read replica's.

    ``replica_url`` (``DATABASE_REPLICA_URL``, PostgreSQL only) is a streaming replica of the
    primary. Only ``replica_reader`` / ``report_sessions`` read from it: the admin dashboard,
    the finance CSV, audit search and the audit export, reads where a few seconds of replication
    lag are harmless. Every write, and every read that must see its own or another process's
    latest writes (logins, budgets, the worker's claims, rate limits), stays on the primary.
    """

    # After the replica failed to connect, reports read from the primary for this long before
    # the replica is tried again (a down replica must not cost every dashboard a connect timeout).
    REPLICA_RETRY_S = 30.0

    def __init__(self, url: str, replica_url: str | None = None, **engine_kwargs):
        self.url = url
        self.engine = make_engine(url, **engine_kwargs)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._readers = sessionmaker(self.engine.execution_options(**{READ_ONLY: True}),
                                     expire_on_commit=False)
        self.replica_url = replica_url or None
        self.replica_engine: Engine | None = None
        self._replica_readers = None
        self._replica_lock = threading.Lock()
        self._replica_down_until = 0.0  # monotonic; 0: not known to be down
        if self.replica_url:
            check_replica_url(url, self.replica_url)
            self.replica_engine = make_engine(self.replica_url, **engine_kwargs)
            # READ ONLY transactions: a write sent here by mistake fails, even on a stand-in
            # that is not a hot standby (a real one refuses writes anyway).
            self._replica_readers = sessionmaker(
                self.replica_engine.execution_options(postgresql_readonly=True),
                expire_on_commit=False)

    @contextlib.contextmanager
    def transaction(self):
        """One unit of work: commit on success, roll back on any error."""
        with self.sessions.begin() as session:
            yield session

    def session(self) -> Session:
        return self.sessions()

    def reader(self) -> Session:
        """A session for reading only, for reads that may last (exports, reports, dashboards).
        On SQLite it begins a plain deferred transaction outside the writer queue instead of
        ``BEGIN IMMEDIATE``, so it never holds the writers up, and a write through it is an
        error (``PRAGMA query_only``). Elsewhere it is ``session()``."""
        return self._readers()

    def report_sessions(self) -> sessionmaker:
        """The session factory for reports, dashboards and exports: the replica's when one is
        set and reachable, else the primary's ``reader``. Chosen once per call, so a report that
        opens several sessions (the audit export's batches) calls this once and reads all of
        them from the same server, never half from a replica that lags.

        A replica that does not connect is logged once (a warning, without its password);
        reads then go to the primary, and the replica is tried again after
        ``REPLICA_RETRY_S``; its return is logged once too.
        """
        if self._replica_readers is None:
            return self._readers
        if self._replica_down_until and time.monotonic() < self._replica_down_until:
            return self._readers
        try:
            with self.replica_engine.connect():  # checks one out (pre-pinged) and back
                pass
        except Exception as exc:  # noqa: BLE001 - whatever the driver raises, reports go on
            with self._replica_lock:
                first = not self._replica_down_until
                self._replica_down_until = time.monotonic() + self.REPLICA_RETRY_S
            if first:
                log.warning("read replica %s unreachable, reports read from the primary "
                            "(retried every %.0f s): %s", self._replica_name(),
                            self.REPLICA_RETRY_S, _first_line(exc))
            return self._readers
        with self._replica_lock:
            recovered, self._replica_down_until = bool(self._replica_down_until), 0.0
        if recovered:
            log.warning("read replica %s reachable again, reports read from it",
                        self._replica_name())
        return self._replica_readers

    def replica_reader(self) -> Session:
        """A read-only session for reports: on the replica (``report_sessions``), else a
        ``reader`` on the primary. Its data may lag the primary by the replication delay: never
        use it for anything that must see a write just made."""
        return self.report_sessions()()

    @property
    def replica_down(self) -> bool:
        """Whether the last attempt to reach the replica failed (reports on the primary)."""
        return bool(self._replica_down_until)

    def _replica_name(self) -> str:
        return make_url(self.replica_url).render_as_string(hide_password=True)

    def writer_holder(self) -> str | None:
        """Who holds SQLite's writer turn now (``WriterQueue.holder``); None off SQLite files."""
        queue = getattr(self.engine, "writer_queue", None)
        return queue.holder() if queue is not None else None

    def dispose(self) -> None:
        self.engine.dispose()
        if self.replica_engine is not None:
            self.replica_engine.dispose()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def check_replica_url(primary_url: str, replica_url: str) -> None:
    """ValueError unless ``replica_url`` can serve as a read replica of ``primary_url``: both
    PostgreSQL (SQLite has no replicas: an embedded file is read where it is written)."""
    try:
        replica = make_url(replica_url)
    except Exception as exc:  # noqa: BLE001 - sqlalchemy.exc.ArgumentError and friends
        raise ValueError(f"is not a database URL: {_first_line(exc)}") from None
    primary = make_url(primary_url)
    if primary.get_backend_name() == "sqlite":
        raise ValueError("is for PostgreSQL only: DATABASE_URL is SQLite, which has no read "
                         "replicas (leave DATABASE_REPLICA_URL empty)")
    if replica.get_backend_name() != primary.get_backend_name():
        raise ValueError(f"must be the same database as DATABASE_URL "
                         f"({primary.get_backend_name()}), not {replica.get_backend_name()}")
    if (replica.host, replica.port, replica.database) == (primary.host, primary.port,
                                                          primary.database):
        log.info("DATABASE_REPLICA_URL names the primary itself: reports read from the primary")
