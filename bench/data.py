"""Data-layer figures on PostgreSQL: accounting calls/s, and dashboard aggregates over 1M usage rows.

    python -m bench.data [--server postgresql+psycopg://postgres@127.0.0.1:5432/test]
                         [--rows 1000000] [--runs 30] [--inserts 2000] [--accounting-only]

Everything happens in a throwaway database (``bench_data_<random>``), dropped at the end:

1. ``Accounting.settle`` (usage row + rollup upsert), ``--inserts`` calls on 1 thread and on 8,
   then ``reserve`` + ``settle`` with every call under a company-wide and a department budget
   (the rows every call locks), on 1 thread and on 8: calls per second, PASS/FAIL against the
   targets (8 threads: settle >= 1,000/s, reserve + settle >= 500/s), and a check that the
   budgets' spend is the usage rows' cost with nothing left reserved. The exit status is 1 when
   any of these fails. ``--accounting-only`` stops here;
2. bulk-load ``--rows`` usage rows with COPY (60 days, 2,000 users in 30 departments, 4 models),
   build the daily rollups with one ``INSERT ... SELECT ... GROUP BY``, ANALYZE;
3. the dashboard's aggregates, each ``--runs`` times, p50/p95 in ms: by day, by department, top
   users, by model (from ``usage_daily``, mostly over 30 days, one over all 60), one department's
   users, and for comparison the by-day
   aggregate straight from ``usage_records``. Target: p95 < 300 ms on the rollups.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import sqlalchemy as sa

from app import migrate
from app.accounting import Accounting, Usage, set_budget, set_price
from app.db import Database
from app.models import BudgetPeriod, UsageRecord

TZ = ZoneInfo("Asia/Shanghai")
MODELS = [("glm-4", 0.6, (4, 1, 16)), ("glm-4-air", 0.25, (1, 0.5, 2)),
          ("glm-5", 0.1, (10, 2, 40)), ("embedding", 0.05, (0.5, 0.5, 0))]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


SETTLE_TARGET = 1000  # calls/s, 8 threads, PostgreSQL
RESERVE_SETTLE_TARGET = 500


def _threaded(threads: int, calls: int, one) -> float:
    """Calls per second of ``one(thread, k)`` run ``calls`` times in all over ``threads`` threads."""
    per = calls // threads
    barrier = threading.Barrier(threads)

    def worker(t):
        barrier.wait()
        for k in range(per):
            one(t, k)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, range(threads)))
    return per * threads / (time.perf_counter() - start)


def bench_inserts(db: Database, n: int) -> bool:
    """settle alone and reserve + settle, 1 and 8 threads; True when the 8-thread targets pass."""
    accounting = Accounting(db, TZ)
    with db.transaction() as session:
        for name, _, (i, c, o) in MODELS:
            set_price(session, name, i, c, o)

    def settle(t, k):
        accounting.settle(None, Usage(f"user{t:02d}{k % 50:03d}", f"d{t}", "glm-4", 800, 300, 100))

    def reserve_settle(t, k):
        user = f"user{t:02d}{k % 50:03d}"
        admission = accounting.reserve(user, "d1", "glm-4", 800, 512)
        assert admission.allowed
        accounting.settle(admission, Usage(user, "d1", "glm-4", 800, 300, 100))

    plain = _threaded(1, n, settle)
    threaded = _threaded(8, n, settle)
    with db.transaction() as session:  # every call below is under both: one company-wide row
        before = session.scalar(sa.text("SELECT max(id) FROM usage_records"))
        set_budget(session, "department", "d1", "month", 1_000_000)
        set_budget(session, "global", "", "month", 10_000_000)
    budgeted = _threaded(1, n, reserve_settle)
    budgeted8 = _threaded(8, n, reserve_settle)
    ok_settle, ok_budgeted = threaded >= SETTLE_TARGET, budgeted8 >= RESERVE_SETTLE_TARGET
    print(f"settle (usage row + rollup), 1 thread:             {plain:8.0f} calls/s")
    print(f"settle, 8 threads:                                 {threaded:8.0f} calls/s "
          f"(target >= {SETTLE_TARGET}: {'PASS' if ok_settle else 'FAIL'})")
    print(f"reserve + settle, company + department budget, 1 thread: {budgeted:8.0f} calls/s")
    print(f"reserve + settle, company + department budget, 8 threads: {budgeted8:8.0f} calls/s "
          f"(target >= {RESERVE_SETTLE_TARGET}: {'PASS' if ok_budgeted else 'FAIL'})")
    with db.session() as session:  # the figures add up: every call's cost is in the budgets
        spent = session.scalar(sa.select(sa.func.sum(BudgetPeriod.spent)))
        reserved = session.scalar(sa.select(sa.func.sum(BudgetPeriod.reserved)))
        charged = session.scalar(sa.select(sa.func.sum(UsageRecord.cost))
                                 .where(UsageRecord.id > before))
    consistent = reserved == 0 and spent == 2 * charged
    print(f"budget rows after the runs: reserved {reserved}, spent {spent} = 2 x usage "
          f"{charged}: {'PASS' if consistent else 'FAIL'}")
    return ok_settle and ok_budgeted and consistent


def bulk_load(url: str, rows: int) -> None:
    rng = random.Random(7)
    users = [(f"{uuid.UUID(int=rng.getrandbits(128)).hex}{'0' * 32}"[:64], f"d{rng.randrange(30)}")
             for _ in range(2000)]
    names = [m[0] for m in MODELS]
    weights = [m[1] for m in MODELS]
    prices = {m[0]: m[2] for m in MODELS}
    today = datetime.now(UTC)
    start = time.perf_counter()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy("COPY usage_records (created_at, day, user_hash, department, model, "
                      "prompt_tokens, cached_tokens, completion_tokens, cost, currency, latency_ms) "
                      "FROM STDIN") as copy:
            for _ in range(rows):
                at = today - timedelta(seconds=rng.randrange(60 * 86400))
                user, dept = users[min(int(rng.paretovariate(1.2)) - 1, 1999) if rng.random() < 0.3
                                   else rng.randrange(2000)]
                model = rng.choices(names, weights)[0]
                prompt, cached, completion = rng.randrange(50, 4000), 0, rng.randrange(1, 800)
                if rng.random() < 0.3:
                    cached = rng.randrange(prompt)
                pi, pc, po = prices[model]
                micros = int((prompt - cached) * pi + cached * pc + completion * po)
                copy.write_row((at, at.astimezone(TZ).date(), user, dept, model, prompt, cached,
                                completion, micros, "CNY", rng.randrange(200, 8000)))
        loaded = time.perf_counter() - start
        cur.execute("""
            INSERT INTO usage_daily (day, department, user_hash, model, calls, prompt_tokens,
                                     cached_tokens, completion_tokens, cost)
            SELECT day, department, user_hash, model, count(*), sum(prompt_tokens),
                   sum(cached_tokens), sum(completion_tokens), sum(cost)
            FROM usage_records GROUP BY day, department, user_hash, model
            ON CONFLICT (day, department, user_hash, model) DO UPDATE SET
                calls = usage_daily.calls + excluded.calls,
                prompt_tokens = usage_daily.prompt_tokens + excluded.prompt_tokens,
                cached_tokens = usage_daily.cached_tokens + excluded.cached_tokens,
                completion_tokens = usage_daily.completion_tokens + excluded.completion_tokens,
                cost = usage_daily.cost + excluded.cost""")
        conn.commit()
        conn.autocommit = True
        cur.execute("VACUUM ANALYZE usage_records")
        cur.execute("VACUUM ANALYZE usage_daily")
        cur.execute("SELECT count(*) FROM usage_records")
        total = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM usage_daily")
        daily = cur.fetchone()[0]
    print(f"bulk load: {total} usage rows by COPY in {loaded:.1f} s "
          f"({total / loaded:.0f} rows/s); {daily} rollup rows "
          f"(+{time.perf_counter() - start - loaded:.1f} s incl. rollup build and ANALYZE)")


def aggregates(today: date) -> dict[str, tuple[str, dict]]:
    month = today.replace(day=1)
    since30 = today - timedelta(days=29)
    return {
        "by day (30 days)": (
            "SELECT day, sum(calls), sum(cost) FROM usage_daily WHERE day >= :since "
            "GROUP BY day ORDER BY day", {"since": since30}),
        "by department (30 days)": (
            "SELECT department, sum(calls), sum(cost) FROM usage_daily WHERE day >= :since "
            "GROUP BY department ORDER BY 3 DESC", {"since": since30}),
        "top 20 users (30 days)": (
            "SELECT user_hash, sum(calls), sum(cost) FROM usage_daily WHERE day >= :since "
            "GROUP BY user_hash ORDER BY 3 DESC LIMIT 20", {"since": since30}),
        "by department (this month)": (
            "SELECT department, sum(calls), sum(cost) FROM usage_daily WHERE day >= :since "
            "GROUP BY department ORDER BY 3 DESC", {"since": month}),
        "by day x department (all 60 days)": (
            "SELECT day, department, sum(cost) FROM usage_daily "
            "GROUP BY day, department ORDER BY day", {}),
        "by model (30 days)": (
            "SELECT model, sum(prompt_tokens), sum(completion_tokens), sum(cost) FROM usage_daily "
            "WHERE day >= :since GROUP BY model ORDER BY 4 DESC", {"since": since30}),
        "one department x user x day (30 days)": (
            "SELECT day, user_hash, sum(cost) FROM usage_daily WHERE department = :d AND day >= :since "
            "GROUP BY day, user_hash ORDER BY day", {"d": "d3", "since": since30}),
        "[raw usage_records] by day (30 days)": (
            "SELECT day, count(*), sum(cost) FROM usage_records WHERE day >= :since "
            "GROUP BY day ORDER BY day", {"since": since30}),
    }


def bench_aggregates(db: Database, runs: int) -> None:
    today = datetime.now(TZ).date()
    print(f"{'aggregate':42s} {'rows':>6s} {'p50 ms':>8s} {'p95 ms':>8s}")
    with db.engine.connect() as conn:
        for name, (sql, params) in aggregates(today).items():
            times, count = [], 0
            for _ in range(runs if not name.startswith("[raw") else max(5, runs // 6)):
                start = time.perf_counter()
                count = len(conn.execute(sa.text(sql), params).all())
                times.append((time.perf_counter() - start) * 1000)
            print(f"{name:42s} {count:6d} {statistics.median(times):8.1f} {percentile(times, 95):8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--inserts", type=int, default=2000)
    parser.add_argument("--accounting-only", action="store_true",
                        help="only the settle and reserve + settle figures (no 1M-row load)")
    args = parser.parse_args()

    name = f"bench_data_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(args.server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = args.server.rsplit("/", 1)[0] + f"/{name}"
    try:
        migrate.upgrade(url)
        db = Database(url)
        passed = bench_inserts(db, args.inserts)
        if args.accounting_only:
            db.dispose()
            sys.exit(0 if passed else 1)
        with db.engine.begin() as conn:  # start the big load from empty usage tables
            conn.execute(sa.text("TRUNCATE usage_records, usage_daily"))
        bulk_load(url.replace("postgresql+psycopg", "postgresql"), args.rows)
        bench_aggregates(db, args.runs)
        db.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
