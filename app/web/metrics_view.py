"""``GET /metrics``: the web side's Prometheus exposition, for loopback or a bearer token only.

Under gunicorn every worker process writes its counters to ``PROMETHEUS_MULTIPROC_DIR`` and a
scrape (answered by any one worker) adds all the files up; without that directory (the Flask
dev server, tests) the process's own registry is served. The scrape-time collectors (queue
depth, spend per budget) run in the answering process.

Access: a request from 127.0.0.1/::1 passes, as does ``Authorization: Bearer <METRICS_TOKEN>``
(compared in constant time); anything else is 403 (401 for a wrong token), so the spend and
traffic figures never leak to the internet. Behind nginx the remote address is the proxy's
unless the real-IP headers are applied (ProxyFix), so do not route ``/metrics`` through the
public server block: scrape gunicorn directly or send the token.
"""

from __future__ import annotations

import hmac
import ipaddress
import os

from flask import Blueprint, Response, current_app, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from app.broker.task_queue import is_amqp
from app.metrics.collectors import (
    AmqpQueueDepthCollector,
    BudgetSpendCollector,
    QueueDepthCollector,
)

bp = Blueprint("metrics", __name__)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def scrape_registry(services) -> CollectorRegistry:
    """The registry of the scrape-time collectors, one per app."""
    from app import redis_client

    registry = CollectorRegistry(auto_describe=False)
    broker = services.settings.celery_broker_url
    if is_amqp(broker):
        registry.register(AmqpQueueDepthCollector(broker))
    else:
        queue_redis = services.redis if broker == services.settings.redis_url else redis_client.from_url(
            broker, socket_timeout=2, socket_connect_timeout=1)
        registry.register(QueueDepthCollector(queue_redis))
    registry.register(BudgetSpendCollector(services.db, services.settings.timezone))
    return registry


def _event_metrics() -> bytes:
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    return generate_latest(registry)


def _allowed() -> tuple[bool, int]:
    token = current_app.extensions["services"].settings.metrics_token.get_secret_value()
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, given = header.partition(" ")
        ok = bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode())
        return ok, 401
    try:
        loopback = ipaddress.ip_address(request.remote_addr or "").is_loopback
    except ValueError:
        loopback = False
    return loopback, 403


@bp.get("/metrics")
def metrics():
    allowed, status = _allowed()
    if not allowed:
        return jsonify(error="metrics are available from loopback or with the metrics token"), status
    body = _event_metrics() + generate_latest(current_app.extensions["metrics_registry"])
    return Response(body, content_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})
