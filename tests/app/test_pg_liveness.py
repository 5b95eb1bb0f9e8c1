"""Pooled PostgreSQL connections are checked at checkout without a round trip
(app/pg_liveness.py): a healthy one is used as it is, one the server closed is replaced before
the caller's first statement. On the real server."""

from __future__ import annotations

import socket
import time

import pytest
import sqlalchemy as sa

from app import pg_liveness
from app.db import make_engine
from tests.support import postgres


@pytest.fixture
def engine():
    postgres.skip_if_opted_out()
    engine = make_engine(postgres.SERVER, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        engine.dispose()
        postgres.unreachable(exc)
    yield engine
    engine.dispose()


@pytest.fixture
def pings(engine, monkeypatch):
    """How many times the dialect's real ping (a round trip) ran."""
    calls = []
    real = engine.dialect.do_ping
    monkeypatch.setattr(engine.dialect, "do_ping", lambda conn: calls.append(1) or real(conn))
    return calls


def _backend_pid(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()


def _terminate(pid: int) -> None:
    """End backend ``pid`` and wait until it has gone (the termination itself is asynchronous)."""
    other = sa.create_engine(postgres.SERVER, poolclass=sa.pool.NullPool)
    gone = sa.text("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = :pid")
    try:
        with other.connect() as connection:
            assert connection.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
            deadline = time.monotonic() + 10
            while not connection.execute(gone, {"pid": pid}).scalar():
                assert time.monotonic() < deadline, "the terminated backend is still there"
                time.sleep(0.01)
    finally:
        other.dispose()


def test_the_engine_leaves_out_sqlalchemys_select_1(engine):
    assert engine.pool._pre_ping is False


def test_a_healthy_pooled_connection_is_used_without_a_ping(engine, pings):
    first = _backend_pid(engine)
    assert [_backend_pid(engine) for _ in range(5)] == [first] * 5
    assert pings == []


def test_a_connection_the_server_closed_is_replaced_before_the_first_statement(engine, pings):
    first = _backend_pid(engine)
    _terminate(first)
    # The caller's statement runs on a fresh connection: no error reaches it.
    second = _backend_pid(engine)
    assert second != first
    assert len(pings) == 1  # the terminated one had the server's FATAL to read: pinged, failed
    assert _backend_pid(engine) == second and len(pings) == 1


def test_has_input_sees_bytes_and_the_end_of_a_stream_without_waiting():
    left, right = socket.socketpair()
    try:
        assert not pg_liveness.has_input(left.fileno())
        right.send(b"x")
        assert pg_liveness.has_input(left.fileno())
        left.recv(1)
        assert not pg_liveness.has_input(left.fileno())
        right.close()
        assert pg_liveness.has_input(left.fileno())
    finally:
        left.close()
