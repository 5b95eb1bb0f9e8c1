"""Checking a pooled PostgreSQL connection at checkout without a round trip.

SQLAlchemy's ``pool_pre_ping`` sends ``SELECT 1`` at every checkout: the worker checks out a
connection about four times a message (the claim, the reply, the finish, the accounting batch),
and those pings were about a twentieth of its CPU under ``bench.load``. A connection that the
server has closed (a restart, ``pg_terminate_backend``, an idle-session timeout) has something to
read on its socket: the server's FATAL message and the end of the stream; a healthy idle one has
nothing (this product never LISTENs). So the check polls the socket without waiting, and only
when there is something to read (or psycopg has marked the connection broken) does it ping for
real; a connection that fails the ping is replaced by a fresh one before the caller's first
statement (``DisconnectionError``: the pool reconnects).

What neither this nor ``SELECT 1`` detects quickly is a server that vanished without closing the
connection (a host lost from the network): both wait for TCP, and the connect timeout and the
statements' own errors handle that case as before.
"""

from __future__ import annotations

import select

from sqlalchemy import event, exc
from sqlalchemy.engine import Connection, Engine

_EVENTS = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP


def install(engine: Engine) -> None:
    """Check ``engine``'s psycopg connections at checkout (in place of ``pool_pre_ping``)."""
    dialect = engine.dialect

    @event.listens_for(engine, "checkout")
    def _check(dbapi_connection, _record, _proxy):
        problem = _problem(dialect, dbapi_connection)
        if problem is not None:
            raise exc.DisconnectionError(problem)


def still_open(connection: Connection) -> bool:
    """The checkout's check for a connection held between uses (the accounting writer keeps
    its own while calls keep coming): False when it is closed or the server closed it."""
    if connection.closed or connection.invalidated:
        return False
    if connection.dialect.driver != "psycopg":  # SQLite: no server to close it
        return True
    return _problem(connection.dialect, connection.connection.dbapi_connection) is None


def _problem(dialect, dbapi_connection) -> str | None:
    """Why a psycopg connection cannot be used, or None (a round trip only when its socket has
    something to report)."""
    if dbapi_connection.closed or dbapi_connection.broken:
        return "the connection was closed"
    if not has_input(dbapi_connection.fileno()):
        return None
    try:
        dialect.do_ping(dbapi_connection)
    except dialect.loaded_dbapi.Error as error:
        return f"the server closed the connection: {type(error).__name__}"
    return None


def has_input(fd: int) -> bool:
    """Whether ``fd`` has bytes, an end of stream or an error to report, now (never waits)."""
    poller = select.poll()  # not select(): it cannot take descriptors above FD_SETSIZE
    poller.register(fd, _EVENTS)
    return bool(poller.poll(0))
