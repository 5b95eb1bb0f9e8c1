"""Appends while an audit purge runs: how long the longest one waits.

``python -m bench.audit_purge [--rows 100000] [--old 20000] [--postgres]``: seeds a sealed chain
(SQLite temp file, or a throwaway PostgreSQL database on 127.0.0.1), backdates its first
``--old`` rows past the retention, then purges them while a thread appends one event every
5 ms, and prints the verification time, the purge time and the appends' p50/max latency. A
purge that verified under the chain lock held every append for the whole verification.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import timedelta

import sqlalchemy as sa

from app import migrate
from app.audit.chain import Event, EventType
from app.audit.head import Head
from app.db import Database, utcnow
from app.models import AuditChain, AuditEvent
from app.services import Services
from tests.support.env import make_env, settings_from

PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@contextmanager
def database(postgres: bool):
    if not postgres:
        yield f"sqlite:///{tempfile.mkdtemp()}/audit.sqlite3"
        return
    name = f"bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_SERVER.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def seed(services: Services, rows: int, old: int) -> None:
    """``rows`` events, the first ``old`` of them sealed as if written 200 days ago."""
    audit, db = services.audit, services.db
    for _ in range(0, rows, 500):
        with db.transaction() as session:
            audit.append_many(session, [Event(EventType.REPLY_SENT, "bench", payload={"n": 1})] * 500)
    then = utcnow() - timedelta(days=200)
    with db.transaction() as session:
        prev = "0" * 64
        for row in session.query(AuditEvent).order_by(AuditEvent.seq).yield_per(2000):
            if row.seq <= old:
                row.created_at = then
            row.prev_hash = prev
            row.row_hash = prev = audit.seal(row)
        head = session.get(AuditChain, 1)
        head.last_hash, head.updated_at = prev, utcnow()
        head.head_mac = audit.head_mac(Head.of(head))


def measure(services: Services) -> str:
    audit, db = services.audit, services.db
    began = time.perf_counter()
    assert audit.check(db).ok
    verify_s = time.perf_counter() - began
    latencies: list[float] = []
    stop = threading.Event()

    def append() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            audit.record(db, EventType.REPLY_SENT, actor="during-purge", payload={})
            latencies.append(time.perf_counter() - began)
            time.sleep(0.005)

    thread = threading.Thread(target=append)
    thread.start()
    time.sleep(0.3)
    began = time.perf_counter()
    purged = audit.purge(db, 180)
    purge_s = time.perf_counter() - began
    time.sleep(0.3)
    stop.set()
    thread.join()
    return (f"verify {verify_s:.2f} s; purge of {purged} rows {purge_s:.2f} s; {len(latencies)} appends "
            f"meanwhile: p50 {statistics.median(latencies) * 1e3:.1f} ms, max {max(latencies) * 1e3:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--old", type=int, default=20_000)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    with database(args.postgres) as url:
        migrate.upgrade(url)
        db = Database(url)
        services = Services(settings_from(make_env(DATABASE_URL=url)), db)
        seed(services, args.rows, args.old)
        kind = "PostgreSQL" if args.postgres else "SQLite"
        print(f"{kind}, {args.rows} rows: {measure(services)}")
        db.dispose()


if __name__ == "__main__":
    main()
