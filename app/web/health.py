"""``/healthz`` (liveness) and ``/readyz`` (readiness) for container health checks and balancers.

Liveness says only that this process answers, so an orchestrator does not restart the web
service because the database blinked. Readiness says whether a message accepted now would be
handled: the database and Redis answer and at least one Celery worker's heartbeat
(``worker/observability/heartbeat.py``) is fresh. A failing readiness names what is down (503),
without error text, which could carry host names.
"""

from __future__ import annotations

import logging

import redis
from flask import Blueprint, current_app, jsonify

from app.heartbeats import live_nodes
from app.services import Services

log = logging.getLogger(__name__)
bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz():
    checks, workers = readiness(current_app.extensions["services"])
    down = [name for name, state in checks.items() if state == "down"]
    body = {"status": "unavailable" if down else "ok", "checks": checks, "workers": workers}
    if down:
        body["down"] = down
    return jsonify(body), 503 if down else 200


def readiness(services: Services) -> tuple[dict[str, str], int]:
    """({"database"|"redis"|"worker": "ok"|"down"|"unknown"}, live worker count)."""
    checks = {"database": _database(services), "redis": "ok", "worker": "unknown"}
    try:
        workers = len(live_nodes(services.redis, "worker"))
    except redis.RedisError as exc:
        log.warning("readiness: redis down error=%s", type(exc).__name__)
        checks["redis"] = "down"
        return checks, 0  # the heartbeats live in Redis: unknown, not down
    checks["worker"] = "ok" if workers else "down"
    return checks, workers


def _database(services: Services) -> str:
    # A raw DBAPI round trip: no ORM transaction, so no BEGIN IMMEDIATE waiting on SQLite's lock.
    try:
        conn = services.db.engine.raw_connection()
        try:
            cursor = conn.cursor()
            cursor.execute("SELECT 1")
            cursor.fetchall()
            cursor.close()
        finally:
            conn.close()
    except Exception as exc:  # SQLAlchemy's wrapped errors and the raw DBAPI ones alike
        log.warning("readiness: database down error=%s", type(exc).__name__)
        return "down"
    return "ok"
