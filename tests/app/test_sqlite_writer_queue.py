"""SQLite writers queue on a file lock before BEGIN IMMEDIATE (app/db.py): no transaction is
lost or interleaved, and every way a transaction ends hands the turn on."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from app.db import Database


def _counter_db(tmp_path, **engine_kwargs) -> Database:
    db = Database(f"sqlite:///{tmp_path}/queue.db", **engine_kwargs)
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


def _writes_within(db: Database, seconds: float) -> bool:
    other = threading.Thread(target=_increment, args=(db, 1), daemon=True)
    other.start()
    other.join(seconds)
    return not other.is_alive()


def test_a_transaction_ended_on_another_thread_hands_the_turn_on(tmp_path):
    """The turn is the connection's: ended elsewhere (a connection closed by the thread that
    received it, or by the garbage collector), it still passes on."""
    db = _counter_db(tmp_path)
    began = threading.Event()
    holder: dict = {}

    def begin_here() -> None:
        connection = db.engine.connect()
        connection.execute(text("UPDATE counter SET n = 5"))
        holder["connection"] = connection
        began.set()

    starter = threading.Thread(target=begin_here)
    starter.start()
    starter.join(10)
    assert began.is_set()
    connection = holder.pop("connection")
    connection.commit()  # on this thread, not the one that began
    connection.close()
    assert _writes_within(db, 10), "the turn stayed with the thread that began the transaction"
    assert _count(db) == 6


def test_a_connection_dropped_mid_transaction_hands_the_turn_on(tmp_path):
    db = _counter_db(tmp_path)
    connection = db.engine.connect()
    connection.execute(text("UPDATE counter SET n = 7"))
    connection.invalidate()  # its DBAPI connection is closed, the transaction with it
    assert _writes_within(db, 10), "an invalidated connection kept the writer turn"
    connection.rollback()
    connection.close()
    assert _count(db) == 1


def test_the_holder_is_named_while_it_holds_the_turn(tmp_path):
    db = _counter_db(tmp_path)
    assert db.writer_holder() == "nobody"
    with db.transaction() as session:
        session.execute(text("UPDATE counter SET n = 1"))
        held = db.writer_holder()
    assert held.startswith(f"pid {os.getpid()} thread {threading.current_thread().name!r} for ")
    assert db.writer_holder() == "nobody"
    assert Database("sqlite:///:memory:").writer_holder() is None


def test_threads_that_write_first_at_once_in_a_new_process_do_not_wedge(tmp_path):
    """The queue sets itself up per process on first use; threads racing to be first once each
    opened a lock of their own, and the loser's turn was never given back."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as it can be: races show
    try:
        _first_writes_race(tmp_path)
    finally:
        sys.setswitchinterval(switch)


def _first_writes_race(tmp_path):
    for attempt in range(20):
        db = _counter_db(tmp_path / str(attempt))
        db.engine.dispose()
        queue = db.engine.writer_queue
        queue._pid = None  # as in a process that has not written yet
        start = threading.Barrier(8)

        def first_write(db=db, start=start):
            start.wait(10)
            _increment(db, 1)

        threads = [threading.Thread(target=first_write, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads), f"writers wedged on attempt {attempt}"
        assert _count(db) == 8


def test_a_long_read_does_not_hold_the_writers_up(tmp_path):
    """A reader session (a streamed export) reads its snapshot while writers go on."""
    db = _counter_db(tmp_path)
    with db.reader() as reader:
        before = reader.execute(text("SELECT n FROM counter")).scalar()
        assert _writes_within(db, 5), "a writer waited for a read-only session"
        assert reader.execute(text("SELECT n FROM counter")).scalar() == before  # its snapshot
    assert _count(db) == 1


def test_a_reader_cannot_write_and_the_connection_writes_again_after(tmp_path):
    db = _counter_db(tmp_path, pool_size=1, max_overflow=0)  # the writer gets the reader's connection
    with db.reader() as reader, pytest.raises(OperationalError, match="readonly"):
        reader.execute(text("UPDATE counter SET n = 5"))
    _increment(db, 1)
    with db.reader() as reader:
        assert reader.execute(text("SELECT n FROM counter")).scalar() == 1
