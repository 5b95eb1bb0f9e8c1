"""Login: N parallel wrong passwords against one admin account, in one web process.

Builds the app (``create_app``) over a fresh SQLite file (or ``--database-url``) and Redis DB 13
(``--redis-url``; its failed-login counters are cleared first), creates one account, and fires
``--parallel`` wrong passwords at it at once, each from its own client address (so the per-address
limit does not hide the lockout), through Flask's test client on as many threads. Argon2 runs with
its real parameters (64 MiB a check).

    python -m bench.login [--parallel 50] [--database-url URL] [--redis-url URL]

Prints how many guesses were checked against the account's real hash (the lockout must stop it at
``ADMIN_LOCKOUT_ATTEMPTS``, 5), the most password checks running at once (at most
``ADMIN_LOGIN_CONCURRENCY``, 2), the statuses, whether the account ended locked, and the process's
peak RSS before and after (bounded: the checks run a few at a time, not 50 x 64 MiB). Exit 1 when
a target is missed.
"""

from __future__ import annotations

import argparse
import collections
import re
import resource
import tempfile
import threading
import time
from pathlib import Path

import redis
from sqlalchemy import select

from app import migrate
from app.models import AdminUser
from app.services import Services
from app.web.admin import accounts
from app.web.factory import create_app
from tests.support.env import make_env, settings_from

TOKEN = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')
PASSWORD = "bench password correct"
RSS_BUDGET_MIB = 400  # over the start: 2 checks of 64 MiB plus threads and the app's own


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parallel", type=int, default=50)
    parser.add_argument("--database-url")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory()
    url = args.database_url or f"sqlite:///{Path(tmp.name) / 'login.sqlite3'}"
    migrate.upgrade(url)
    r = redis.Redis.from_url(args.redis_url)
    for key in r.scan_iter("ratelimit:admin-login:*"):
        r.delete(key)
    settings = settings_from(make_env(DATABASE_URL=url, REDIS_URL=args.redis_url, SESSION_COOKIE_SECURE="false"))
    services = Services(settings)
    app = create_app(services=services)
    with services.db.transaction() as session:
        accounts.create_user(session, "bench-admin", "admin", PASSWORD)

    real, stats, lock = accounts._verify, {"real": 0, "running": 0, "peak": 0}, threading.Lock()

    def counting(password_hash, password):
        with lock:
            stats["real"] += password_hash != accounts._DUMMY_HASH
            stats["running"] += 1
            stats["peak"] = max(stats["peak"], stats["running"])
        try:
            return real(password_hash, password)
        finally:
            with lock:
                stats["running"] -= 1

    accounts._verify = counting
    clients = []
    for i in range(args.parallel):
        client = app.test_client()
        client.environ_base["REMOTE_ADDR"] = f"10.9.{i // 250}.{i % 250 + 1}"
        clients.append((client, TOKEN.search(client.get("/admin/login").get_data(as_text=True)).group(1)))
    rss_before = peak_rss_mib()
    statuses: collections.Counter = collections.Counter()
    barrier = threading.Barrier(len(clients))

    def guess(client, token, i):
        barrier.wait()
        response = client.post("/admin/login", data={"name": "bench-admin", "password": f"wrong {i}",
                                                      "csrf_token": token})
        with lock:
            statuses[response.status_code] += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=guess, args=(c, t, i)) for i, (c, t) in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    rss_after = peak_rss_mib()
    with services.db.session() as session:
        user = session.scalar(select(AdminUser).where(AdminUser.name == "bench-admin"))
    locked = user.locked_until is not None

    limit, concurrency = settings.admin_lockout_attempts, settings.admin_login_concurrency
    print(f"{args.parallel} parallel wrong passwords in {elapsed:.1f} s: statuses {dict(statuses)}")
    print(f"checked against the real hash: {stats['real']} (target <= {limit}); account locked: {locked}")
    print(f"password checks at once: peak {stats['peak']} (target <= {concurrency})")
    print(f"peak RSS: {rss_before:.0f} MiB before, {rss_after:.0f} MiB after "
          f"(+{rss_after - rss_before:.0f}, target < +{RSS_BUDGET_MIB})")
    verdicts = {"locked after at most the lockout count": locked and stats["real"] <= limit,
                "checks bounded": stats["peak"] <= concurrency,
                "memory bounded": rss_after - rss_before < RSS_BUDGET_MIB,
                "no 5xx": not any(code >= 500 for code in statuses)}
    for name, ok in verdicts.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    services.db.dispose()
    tmp.cleanup()
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
