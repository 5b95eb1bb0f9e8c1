"""SQLAlchemy engine and sessions, one per process.

SQLite (the embedded default) is opened in WAL mode with a busy timeout so that several gunicorn
workers and Celery threads can write at once; PostgreSQL needs nothing special.

On SQLite every transaction starts with ``BEGIN IMMEDIATE`` (SQLAlchemy's recipe for pysqlite,
whose own implicit transactions begin only at the first write and let ``SAVEPOINT``/``RELEASE``
commit on their own): a unit of work is then really atomic (the callback's outbox row and audit
event commit or roll back together), and a transaction that reads before it writes cannot fail
with a stale snapshot, because it holds the single write lock from the start and waits for it
under the busy timeout instead.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from sqlalchemy import BigInteger, DateTime, create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator


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
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(connection):
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 5)
    kwargs.setdefault("max_overflow", 10)
    kwargs.setdefault("connect_args", {"connect_timeout": 3})
    return create_engine(url, **kwargs)


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
