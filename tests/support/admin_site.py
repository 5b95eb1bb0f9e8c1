"""The admin site as it runs, for the browser tests and scripts/screenshots.py: gunicorn serving
``app.web.factory:create_app()`` over a fresh SQLite file (or PostgreSQL database) seeded with demo data
through the real code paths (``Accounting.settle``, ``AuditLog.append``), Redis DB 1."""

from __future__ import annotations

import os
import random
import subprocess
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import redis
import requests

from app import migrate
from app.accounting import Accounting, Usage, set_budget, set_price
from app.audit.chain import EventType
from app.db import utcnow
from app.models import InboundMessage
from app.outbox.rows import user_hash
from app.services import Services
from app.web.admin.accounts import create_user
from tests.support.env import make_env, redis_url, settings_from
from tests.support.stack import BIN, ROOT, TempDatabase, free_port, terminate_group, wait_for

PASSWORD = "correct horse battery"
USERS = {"admin": "alice", "finance": "fiona", "auditor": "otto"}
REDIS_URL = redis_url(1)
DEPARTMENTS = {"rd": 8, "sales": 5, "finance": 3, "legal": 2}  # department: people
MODELS = [("glm-4", 10, 2, 30, 0.6), ("glm-4-air", 1, 0.5, 2, 0.3), ("glm-5", 20, 4, 60, 0.1)]
DAYS = 21


def seed_demo(services: Services, seed: int = 7) -> dict:
    """Prices, three weeks of usage, budgets with alerts, messages and audit events."""
    rng = random.Random(seed)
    now = utcnow()
    accounting = Accounting(services.db, services.settings.timezone, audit=services.audit)
    with services.db.transaction() as session:
        for role, name in USERS.items():
            create_user(session, name, role, PASSWORD)
        for model, i, c, o, _ in MODELS:
            set_price(session, model, i, c, o, valid_from=now - timedelta(days=DAYS + 1))
        # Daily limits that today's calls cross (alerts, marked bars); monthly ones with room.
        set_budget(session, "global", "", "day", "0.2", action="warn")
        set_budget(session, "department", "rd", "day", "0.1", thresholds="50,80,100")
        set_budget(session, "department", "sales", "month", "1.5", action="warn")
        set_budget(session, "global", "", "month", "40")
    people = [(user_hash(services.blind_index, f"{dept}{n:02d}"), dept)
              for dept, count in DEPARTMENTS.items() for n in range(count)]
    names, weights = [m[0] for m in MODELS], [m[4] for m in MODELS]
    calls = 0
    for day in range(DAYS, -1, -1):
        for _ in range(rng.randrange(6, 14)):
            who, dept = rng.choice(people)
            at = now - timedelta(days=day, minutes=rng.randrange(0, 600))
            accounting.settle(None, Usage(who, dept, rng.choices(names, weights)[0],
                                          rng.randrange(300, 6000), rng.randrange(50, 1500),
                                          latency_ms=rng.randrange(400, 9000)), now=min(at, now))
            calls += 1
    with services.db.transaction() as session:
        for i in range(60):
            who, _ = rng.choice(people)
            status = rng.choices(["answered", "failed", "ignored"], [50, 4, 3])[0]
            session.add(InboundMessage(dedup_hash=f"demo{i}", user_hash=who, msg_type="text",
                                       wecom_create_time=0, status=status))
            services.audit.append(session, EventType.MESSAGE_RECEIVED, actor=who,
                                  outcome="accepted", payload={"message_id": i, "msg_type": "text"})
            services.audit.append(session, EventType.REPLY_SENT if status == "answered"
                                  else EventType.REPLY_FAILED, actor=who,
                                  outcome="ok" if status == "answered" else "error",
                                  payload={"message_id": i})
        services.audit.append(session, EventType.ADMIN_CHANGE, actor="admin:alice",
                              payload={"action": "budget_create", "scope": "department"})
    return {"calls": calls}


class AdminSite:
    """gunicorn over a seeded database; ``url``, ``services`` (same database and secrets)."""

    def __init__(self, tmp: Path, db_kind: str = "sqlite", workers: int = 2, **extra_env: str):
        self.temp_db = TempDatabase(db_kind, tmp)
        migrate.upgrade(self.temp_db.url)
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.redis.flushdb()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = make_env(DATABASE_URL=self.temp_db.url, REDIS_URL=REDIS_URL,
                            SESSION_COOKIE_SECURE="false", **extra_env)
        self.services = Services(settings_from(self.env))
        self.seeded = seed_demo(self.services)
        self.env.update({"WEB_BIND": f"127.0.0.1:{port}", "WEB_WORKERS": str(workers),
                         "WEB_THREADS": "4", "PYTHONUNBUFFERED": "1"})
        self.log_path = tmp / "gunicorn.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(BIN / "gunicorn"), "app.web.factory:create_app()"], cwd=ROOT,
                                         env={**os.environ, **self.env}, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._ready, 60, what="gunicorn")

    @property
    def secret(self) -> str:
        return self.services.settings.secret_key.get_secret_value()

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log_path.read_text()
        try:
            return requests.get(f"{self.url}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    def stop(self) -> None:
        terminate_group(self.proc)
        self.services.db.dispose()
        self.redis.flushdb()
        self.redis.close()
        self.temp_db.drop()


def total_cost(services: Services) -> Decimal:
    from sqlalchemy import func, select

    from app.models import UsageRecord

    with services.db.session() as session:
        return session.scalar(select(func.sum(UsageRecord.cost))) or Decimal(0)
