"""Usage rows commit out of id order on PostgreSQL (ledger writers of several processes): the
export must never move its cursor past a row that is still to commit."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import insert

from app.db import utcnow
from app.models import UsageRecord
from app.siem import Exporter, build_sinks
from app.siem import cursors as siem_cursors
from app.siem.records import usage_horizon
from tests.app.siem.test_export import siem_services, write_usage


def usage_ids(otlp) -> list[int]:
    return [r["attributes"]["usage.id"] for r in otlp.records if r["scope"].endswith(".usage")]


def open_usage_row(db):
    """A ledger transaction that drew its id and has not committed: (connection, transaction)."""
    conn = db.engine.connect()
    tx = conn.begin()
    conn.execute(insert(UsageRecord).values(
        created_at=utcnow(), day=utcnow().date(), user_hash="slow-writer", department="3",
        model="glm-4", prompt_tokens=1, cached_tokens=0, completion_tokens=1, cost=0,
        currency="CNY", latency_ms=0))
    return conn, tx


def test_a_row_still_to_commit_holds_the_usage_cursor(database_url, db, redis_client, pki, receivers):
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time: its ids commit in order")
    syslog, otlp = receivers
    services = siem_services(database_url, db, pki, syslog, otlp, SIEM_STREAMS="usage")
    sinks = [s for s in build_sinks(services.settings) if s.name == "otlp"]

    conn, tx = open_usage_row(db)  # id 1, in flight
    write_usage(services, 2)  # ids 2 and 3, committed
    assert usage_horizon(db, wait_s=0.2) is None  # not while id 1 may still come
    result = Exporter(services, sinks).run()
    assert result.streams["otlp/usage"].sent == 0 and usage_ids(otlp) == []

    threading.Timer(0.5, tx.commit).start()  # the slow writer commits while the run waits for it
    started = time.monotonic()
    Exporter(services, sinks).run()
    assert time.monotonic() - started < 5
    conn.close()
    assert usage_ids(otlp) == [1, 2, 3]
    assert siem_cursors.load(db, "otlp", "usage").position == 3


def test_a_rolled_back_id_leaves_a_hole_the_export_steps_over(database_url, db, redis_client, pki, receivers):
    syslog, otlp = receivers
    services = siem_services(database_url, db, pki, syslog, otlp, SIEM_STREAMS="usage")
    sinks = [s for s in build_sinks(services.settings) if s.name == "otlp"]
    if db.engine.dialect.name == "postgresql":
        conn, tx = open_usage_row(db)
        write_usage(services, 1)
        tx.rollback()  # id 1 never exists
        conn.close()
        expected = [2]
    else:
        write_usage(services, 1)
        expected = [1]
    write_usage(services, 1)
    Exporter(services, sinks).run()
    assert usage_ids(otlp) == [*expected, expected[-1] + 1]
