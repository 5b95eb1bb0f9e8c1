"""SQLite writers queue on a file lock before BEGIN IMMEDIATE (app/db.py): no transaction is
lost or interleaved, and every way a transaction ends hands the turn on."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pytest
from sqlalchemy import text

from app.db import Database


def _counter_db(tmp_path) -> Database:
    db = Database(f"sqlite:///{tmp_path}/queue.db")
    with db.engine.begin() as connection:
        connection.execute(text("CREATE TABLE counter (n INTEGER)"))
        connection.execute(text("INSERT INTO counter VALUES (0)"))
    return db


def _increment(db: Database, times: int) -> None:
    """Read, then write what was read plus one: lost updates show if two ever overlap."""
    for _ in range(times):
        with db.transaction() as session:
            n = session.execute(text("SELECT n FROM counter")).scalar()
            session.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})


def _count(db: Database) -> int:
    with db.transaction() as session:
        return session.execute(text("SELECT n FROM counter")).scalar()


def test_threads_never_lose_an_update(tmp_path):
    db = _counter_db(tmp_path)
    threads = [threading.Thread(target=_increment, args=(db, 50)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert _count(db) == 300


def _process_increments(url: str, times: int) -> None:
    _increment(Database(url), times)


def test_processes_never_lose_an_update(tmp_path):
    db = _counter_db(tmp_path)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_process_increments, args=(db.url, 40)) for _ in range(3)]
    for p in procs:
        p.start()
    _increment(db, 40)
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert _count(db) == 160


def test_a_failed_transaction_hands_the_turn_on(tmp_path):
    db = _counter_db(tmp_path)
    with pytest.raises(ZeroDivisionError), db.transaction() as session:
        session.execute(text("UPDATE counter SET n = 99"))
        1 / 0  # noqa: B018 - the error that rolls back
    other = threading.Thread(target=_increment, args=(db, 1))
    other.start()
    other.join(10)
    assert not other.is_alive(), "the rolled-back transaction kept the writer lock"
    assert _count(db) == 1
