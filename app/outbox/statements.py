"""Plain SQL on the driver's own cursor, inside a session's transaction, for the hot writes.

The callback's group commit writes three rows per message. Through SQLAlchemy Core every row's
parameters went through the compiled statement's machinery and each column's type processors,
several times what the driver's own ``executemany`` costs; the writer thread that serializes
the callbacks spent most of its time there. So those few statements are written as SQL and run
on the DB-API cursor of the session's connection (the same transaction, the same locks), and
this module does the two things Core did for them: the placeholder style (sqlite3 ``?``,
psycopg ``%s``) and how a UTC time is bound (SQLite stores the text SQLAlchemy writes for its
``DATETIME``; PostgreSQL takes the aware value for its ``timestamptz``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from datetime import UTC, date, datetime

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from app.db import UTCDateTime


class DriverStatements:
    """A cursor on the connection of a session or Core connection (whose transaction it joins),
    or on a pooled connection of its own (``standalone``); SQL is written with ``?``
    placeholders. ``commit`` commits the session's transaction (a no-op in autocommit)."""

    def __init__(self, bind: Session | Connection | None, dbapi_connection=None, sqlite: bool = False):
        if bind is not None:
            connection = bind.connection() if isinstance(bind, Session) else bind
            sqlite, dbapi_connection = (connection.dialect.name == "sqlite",
                                        connection.connection.dbapi_connection)
        self.sqlite = sqlite
        self._session = bind if isinstance(bind, Session) else None
        self._cursor = dbapi_connection.cursor()

    def commit(self) -> None:
        if self._session is not None:
            self._session.commit()

    def execute(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        """Run one statement; the rows it returns (``RETURNING``), if any."""
        cursor = self._cursor
        cursor.execute(_for_driver(sql, self.sqlite), params)
        return cursor.fetchall() if cursor.description else []

    def count(self, sql: str, params: tuple | list = ()) -> int:
        """Run one statement; how many rows it changed."""
        cursor = self._cursor
        cursor.execute(_for_driver(sql, self.sqlite), params)
        return cursor.rowcount

    def executemany(self, sql: str, rows: list[tuple]) -> None:
        if len(rows) == 1:  # psycopg's executemany enters pipeline mode: for one row, a cost alone
            self._cursor.execute(_for_driver(sql, self.sqlite), rows[0])
        elif rows:
            self._cursor.executemany(_for_driver(sql, self.sqlite), rows)

    def time(self, value: datetime) -> datetime | str:
        """``value`` as ``UTCDateTime`` binds it."""
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        if self.sqlite:
            return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        return value

    def day(self, value: date) -> date | str:
        """``value`` as a ``Date`` column binds it (SQLite stores its ISO text)."""
        return value.isoformat() if self.sqlite else value


def statements_of(bind: Session | DriverStatements) -> DriverStatements:
    """What the outbox's statements run on: a session's cursor, or ``standalone``'s."""
    return bind if isinstance(bind, DriverStatements) else DriverStatements(bind)


@contextlib.contextmanager
def standalone(db) -> Iterator[DriverStatements]:
    """Statements each of which commits by itself: the worker's claim, leased-row updates and
    lease renewals. On PostgreSQL a pooled connection in autocommit, straight from the pool (its
    checkout check, ``app.pg_liveness``, included): no ``BEGIN``/``COMMIT`` round trips, and
    none of a Session's or Core connection's bookkeeping, which cost the worker more CPU than
    the three statements a message it ran through them. On SQLite a session (its writer queue
    and ``BEGIN IMMEDIATE``), committed by ``commit()``."""
    if db.engine.dialect.name != "postgresql":
        with db.session() as session:
            yield DriverStatements(session)
        return
    pooled = db.engine.raw_connection()
    connection = pooled.dbapi_connection
    try:
        connection.autocommit = True
        yield DriverStatements(None, connection)
    finally:
        try:  # back to the pool as it came: the next user expects transactions
            connection.autocommit = False
        except Exception:  # noqa: BLE001 - broken (a statement lost the server): not reused
            pooled.invalidate()
        pooled.close()


_TIME = UTCDateTime()


def read_time(value: datetime | str | None) -> datetime | None:
    """A time column as ``UTCDateTime`` reads it (its own conversion): SQLite's cursor gives
    the stored text, PostgreSQL's an aware value."""
    return _TIME.process_result_value(datetime.fromisoformat(value) if isinstance(value, str) else value,
                                      None)


@functools.lru_cache(maxsize=256)
def values_rows(rows: int, columns: int) -> str:
    """``(?, ?), (?, ?)`` for a multi-row ``VALUES``."""
    row = "(" + ", ".join("?" * columns) + ")"
    return ", ".join([row] * rows)


@functools.lru_cache(maxsize=256)
def _for_driver(sql: str, sqlite: bool) -> str:
    return sql if sqlite else sql.replace("?", "%s")
