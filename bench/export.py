"""Audit export over a million rows: rows/s and peak memory, which must not grow with the rows.

    python -m bench.export [--rows 1000000] [--small 100000] [--db-url URL] [--no-trace]

1. seed ``--rows`` audit events into a fresh database (a SQLite file in a temp dir by default;
   ``--db-url`` names a PostgreSQL server, on which a throwaway ``bench_export_<random>`` database
   is made and dropped): real sealed rows (AES-GCM payloads, the HMAC chain, the chain head), so
   the export's own chain check passes; inserted in bulk, 10,000 a statement batch;
2. in a fresh process each, the real ``export_stream`` (chain verification, keyset batches, the
   zip streamed to a file) for a range holding the first ``--small`` rows and for all of them;
   each prints rows/s, the zip's size, the process's RSS just before the export, its peak RSS
   during the export (``VmHWM``, reset just before through ``/proc/self/clear_refs``; else
   ``ru_maxrss``) and how far that peak is above the RSS before, and (unless ``--no-trace``, in a second run, since tracing
   slows Python down) the peak of Python allocations under ``tracemalloc``;
3. ``verify_export`` over the big zip (rows/s), which must find nothing wrong.

Bounded memory means the two sizes' peaks are about the same, not 10x apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import random
import resource
import tempfile
import time
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from app import migrate
from app.audit.chain import TABLE, EventRow, EventType
from app.audit.head import Head
from app.db import utcnow
from app.models import AuditChain, AuditEvent
from app.outbox.rows import user_hash
from app.services import Services
from tests.support.env import make_env, settings_from

BATCH = 10_000
REDIS_URL = "redis://127.0.0.1:6379/1"
TYPES = [(EventType.MESSAGE_RECEIVED, 40), (EventType.REPLY_SENT, 38), (EventType.API_REQUEST, 15),
         (EventType.REPLY_FAILED, 3), (EventType.BUDGET_ALERT, 1), (EventType.ADMIN_LOGIN, 2),
         (EventType.ADMIN_CHANGE, 1)]


def seed(services: Services, rows: int, start: datetime, step: timedelta) -> float:
    """Write ``rows`` sealed events, one every ``step`` from ``start``; seconds taken."""
    rng = random.Random(7)
    users = [user_hash(services.blind_index, f"user{i:04d}") for i in range(2000)]
    names, weights = zip(*TYPES, strict=True)
    audit, cipher, table = services.audit, services.cipher, AuditEvent.__table__
    prev, began = "0" * 64, time.perf_counter()
    with services.db.engine.begin() as conn:
        conn.execute(sa.delete(table))
        batch: list[dict] = []
        for seq in range(1, rows + 1):
            kind = rng.choices(names, weights)[0]
            admin = kind in (EventType.ADMIN_LOGIN, EventType.ADMIN_CHANGE)
            payload = {"message_id": seq, "msg_type": "text", "agent_id": 1000002,
                       "latency_ms": rng.randrange(200, 9000)}
            row = EventRow(
                seq=seq, created_at=start + step * seq, event_type=kind,
                actor="admin:alice" if admin else rng.choice(users), outcome="ok",
                request_id=uuid.UUID(int=rng.getrandbits(128)).hex, fingerprint=None,
                payload_enc=cipher.encrypt(json.dumps(payload, sort_keys=True), TABLE, "payload_enc", seq),
                prev_hash=prev)
            row.row_hash = prev = audit.seal(row)
            batch.append(dataclasses.asdict(row))
            if len(batch) == BATCH:
                conn.execute(sa.insert(table), batch)
                batch = []
        if batch:
            conn.execute(sa.insert(table), batch)
        head = Head(rows, prev, 0, "0" * 64, audit.keys.current_id, utcnow())
        conn.execute(sa.update(AuditChain.__table__).where(AuditChain.id == 1)
                     .values(last_seq=rows, last_hash=prev, key_id=head.key_id,
                             updated_at=head.sealed_at, head_mac=audit.head_mac(head)))
    return time.perf_counter() - began


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Start the peak RSS (VmHWM) afresh, so it measures the export alone (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def export_child(env: dict, since: datetime, until: datetime, out: str, trace: bool) -> dict:
    """One export in this (fresh) process: time, rows, zip size and memory figures."""
    from app.web.admin.audit_export import ExportQuery, export_stream

    services = Services(settings_from(env))
    query = ExportQuery(since, until)
    rows = 0

    def count(n: int) -> None:
        nonlocal rows
        rows += n

    reset = _reset_peak()
    rss_before = _status_kib("VmRSS")
    if trace:
        tracemalloc.start()
    began = time.perf_counter()
    with open(out, "wb") as sink:
        for chunk in export_stream(services, query, reason="bench: bounded memory",
                                   exported_by="bench", progress=count):
            sink.write(chunk)
    seconds = time.perf_counter() - began
    traced = tracemalloc.get_traced_memory()[1] if trace else None
    peak_after = _status_kib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    services.db.dispose()
    return {"rows": rows, "seconds": seconds, "bytes": os.path.getsize(out),
            "rss_before_kib": rss_before, "peak_growth_kib": max(peak_after - rss_before, 0),
            "peak_kib": peak_after, "traced_peak": traced}


def verify_child(env: dict, path: str) -> tuple[float, list[str]]:
    from app.audit.signing import signing_key
    from app.web.admin.audit_export import verify_export

    public_key = signing_key(settings_from(env)).public_key()
    began = time.perf_counter()
    problems = verify_export(path, public_key)
    return time.perf_counter() - began, problems


def _fresh(pool_ctx, fn, *args):
    with pool_ctx.Pool(1, maxtasksperchild=1) as pool:
        return pool.apply(fn, args)


def run(url: str, rows: int, small: int, trace: bool, tmp: Path) -> None:
    migrate.upgrade(url)
    env = make_env(DATABASE_URL=url, REDIS_URL=REDIS_URL)
    services = Services(settings_from(env))
    start = datetime.now(UTC) - timedelta(days=90)
    step = timedelta(days=89) / rows
    seconds = seed(services, rows, start, step)
    services.db.dispose()
    print(f"seed: {rows} sealed audit rows in {seconds:.1f} s ({rows / seconds:,.0f} rows/s), "
          f"{make_url_backend(url)}")
    ctx = mp.get_context("spawn")
    sizes = [(small, start + step * (small + 0.5)), (rows, datetime.now(UTC) + timedelta(days=1))]
    print(f"{'rows':>9s} {'seconds':>8s} {'rows/s':>8s} {'zip MiB':>8s} {'RSS before':>11s} "
          f"{'peak RSS':>10s} {'peak growth':>12s} {'traced peak':>12s}")
    big = None
    for n, until in sizes:
        out = str(tmp / f"export-{n}.zip")
        result = _fresh(ctx, export_child, env, start, until, out, False)
        traced = _fresh(ctx, export_child, env, start, until, out, True)["traced_peak"] \
            if trace else None
        assert result["rows"] == n, result
        print(f"{n:9d} {result['seconds']:8.1f} {n / result['seconds']:8.0f} "
              f"{result['bytes'] / 2**20:8.1f} {result['rss_before_kib'] / 1024:7.1f} MiB "
              f"{result['peak_kib'] / 1024:6.1f} MiB {result['peak_growth_kib'] / 1024:8.1f} MiB "
              + (f"{traced / 2**20:8.1f} MiB" if traced is not None else "       -"))
        big = out
    seconds, problems = _fresh(ctx, verify_child, env, big)
    print(f"verify_export of the {rows}-row zip: {seconds:.1f} s ({rows / seconds:,.0f} rows/s), "
          f"{'intact' if not problems else problems[:3]}")
    assert not problems


def make_url_backend(url: str) -> str:
    return sa.make_url(url).get_backend_name()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--db-url", default=None,
                        help="a PostgreSQL server URL (default: a SQLite file in a temp dir)")
    parser.add_argument("--no-trace", dest="trace", action="store_false",
                        help="skip the tracemalloc runs")
    args = parser.parse_args()
    if not 0 < args.small < args.rows:
        parser.error("--small must be between 0 and --rows")
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        if not args.db_url:
            run(f"sqlite:///{tmp}/audit.sqlite3", args.rows, args.small, args.trace, Path(tmp))
            return
        name = f"bench_export_{uuid.uuid4().hex[:10]}"
        admin = sa.create_engine(args.db_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        try:
            run(args.db_url.rsplit("/", 1)[0] + f"/{name}", args.rows, args.small, args.trace,
                Path(tmp))
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


if __name__ == "__main__":
    main()
