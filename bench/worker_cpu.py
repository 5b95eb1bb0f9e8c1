"""The worker's CPU per message, in-process: what one message costs the worker's Python.

Posts messages through the real callback (signature, decrypt, encrypted outbox row) into the
outbox, then runs ``worker.processor.MessageProcessor`` on them in this process with a fake model
(a fixed reply, reported usage) and a fake WeCom send, and prints the process CPU time per
message: claim, history, reserve, the model call, settle, the stored reply, the send, the audit
and the finish, every statement against the real database. No Celery, no network model, so the
figure is the worker's own cost, the part ``bench.load`` says is the throughput limit.

    python -m bench.worker_cpu [--db sqlite|postgresql|both] [--messages 300] [--budget] 2>log
                               [--profile 30]

``--budget`` adds a company-wide daily budget (every message reserves and settles on it);
``--profile N`` prints the N costliest ``app``/``worker`` functions by cumulative time. A price
for the model is set (as in a deployment), so settle prices the call.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time
import uuid

import sqlalchemy as sa

POSTGRES_ADMIN = os.environ.get("BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
WARMUP = 20


def _database(kind: str, tmp: str) -> tuple[str, callable]:
    if kind == "sqlite":
        return f"sqlite:///{tmp}/worker_cpu.sqlite3", lambda: None
    name = f"bench_worker_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    base = POSTGRES_ADMIN.rsplit("/", 1)[0]

    def drop():
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    return f"{base}/{name}", drop


def run(kind: str, messages: int, budget: bool, profile: int) -> float:
    from app import migrate
    from app.accounting import set_budget, set_price
    from app.db import Database
    from app.services import Services
    from app.web.factory import create_app
    from tests.support.env import make_env, settings_from
    from tests.worker.test_processor_data import FakeLLM, ids_of, post_message, processor_for

    with tempfile.TemporaryDirectory() as tmp:
        url, drop = _database(kind, tmp)
        try:
            migrate.upgrade(url)
            settings = settings_from(make_env(DATABASE_URL=url, REDIS_URL=REDIS_URL))
            db = Database(url)
            services = Services(settings, db)
            services.redis.flushdb()
            with db.transaction() as session:
                set_price(session, "glm-4", "5", "1", "15")
                if budget:
                    set_budget(session, "global", "", "day", "1000000")
            app = create_app(services=services)
            client = app.test_client()
            for i in range(WARMUP):
                post_message(client, services, f"热身 {i}", 500 + i, user=f"warm{i}")
            warm = ids_of(services)
            for i in range(messages):
                r = post_message(client, services, f"年假有几天 {i}", 1000 + i, user=f"user{i % 20}")
                assert r.status_code == 200, r.status_code
            ids = [m for m in ids_of(services) if m not in warm]
            processor = processor_for(services, FakeLLM())
            for m in warm:
                processor.process(m)
            prof = cProfile.Profile(time.process_time) if profile else None  # CPU, not waits
            cpu0, wall0 = time.process_time(), time.perf_counter()
            if prof:
                prof.enable()
            for m in ids:
                processor.process(m)
            if prof:
                prof.disable()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            from app.models import InboundMessage

            with db.session() as session:
                statuses = dict(session.execute(sa.select(InboundMessage.status, sa.func.count())
                                                .where(InboundMessage.id.in_(ids))
                                                .group_by(InboundMessage.status)).all())
            assert statuses == {"answered": len(ids)}, statuses
            per = cpu / len(ids) * 1e3
            print(f"{kind}{' +budget' if budget else ''}: {len(ids)} messages, "
                  f"{per:.2f} ms worker CPU per message ({wall / len(ids) * 1e3:.2f} ms wall)",
                  flush=True)
            if prof:
                stats = pstats.Stats(prof)
                stats.sort_stats("cumulative").print_stats(r"/(app|worker)/", profile)
                stats.sort_stats("tottime").print_stats(profile)
            services.redis.flushdb()
            db.engine.dispose()
            return per
        finally:
            drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--budget", action="store_true")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    args = parser.parse_args()

    kinds = ("sqlite", "postgresql") if args.db == "both" else (args.db,)
    for kind in kinds:
        run(kind, args.messages, args.budget, args.profile)


if __name__ == "__main__":
    main()
