"""SQLite WAL checkpoints run on a thread of each writing process, off the commits' path
(app/db.py ``WalCheckpointer``): committed rows reach the database file on their own, and the
thread leaves when the process stops writing or the database is disposed."""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time

from sqlalchemy import text

from app.db import Database, WalCheckpointer


def _rows_in_the_database_file(path, tmp_path) -> int:
    """Rows of ``t`` in the main file alone: what checkpoints copied there, without the WAL."""
    copy = tmp_path / "copy.db"
    shutil.copyfile(path, copy)
    connection = sqlite3.connect(copy)
    try:
        return connection.execute("SELECT count(*) FROM t").fetchone()[0]
    except sqlite3.DatabaseError:  # not there yet (or copied mid-checkpoint)
        return 0
    finally:
        connection.close()


def _checkpointers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sqlite-checkpoint" and t.is_alive()]


def test_committed_rows_reach_the_database_file_without_a_commit_checkpointing(tmp_path):
    path = tmp_path / "bot.db"
    db = Database(f"sqlite:///{path}")
    with db.engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (n INTEGER)"))
    with db.engine.connect() as connection:
        # Far below the 10,000-page backstop: no commit checkpoints these.
        assert connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 10_000
    for n in range(20):
        with db.engine.begin() as connection:
            connection.execute(text("INSERT INTO t VALUES (:n)"), {"n": n})
    deadline = time.monotonic() + 5
    while _rows_in_the_database_file(path, tmp_path) < 20:
        assert time.monotonic() < deadline, "the WAL was not checkpointed"
        time.sleep(0.05)
    db.dispose()


def test_the_checkpointer_leaves_when_idle_and_the_next_write_brings_one_back(tmp_path):
    path = tmp_path / "bot.db"
    sqlite3.connect(path).close()
    checkpointer = WalCheckpointer(str(path), interval_s=0.02, idle_s=0.1)
    before = set(_checkpointers())
    checkpointer.ensure_running()
    [first] = set(_checkpointers()) - before
    first.join(5)
    assert not first.is_alive()
    checkpointer.ensure_running()
    [second] = set(_checkpointers()) - before
    assert second is not first
    checkpointer.stop()
    second.join(5)
    assert not second.is_alive()


def test_disposing_the_database_stops_its_checkpointer(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/bot.db")
    before = set(_checkpointers())
    with db.engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (n INTEGER)"))
    [thread] = set(_checkpointers()) - before
    db.dispose()
    thread.join(5)
    assert not thread.is_alive()
