"""The worker's and beat's heartbeats in Redis: a thread that keeps each node marked alive.

A worker can be gone while the web service still accepts messages; an expiry time that each
worker pushes forward lets another process tell, without asking the worker over the broker, that
it was alive a moment ago. The keys and the reading are ``app/heartbeats.py``'s (``/readyz``
reads them without importing the worker). A graceful shutdown removes the node so readiness
drops at once; a killed process's entry simply expires. ``worker.celery_app`` starts and stops
it from Celery's signals.

``python -m worker.observability.heartbeat check worker|beat [--node NAME]`` exits 0 when this
host's key is live: the container health check of the worker and beat services.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from contextlib import suppress

import redis

from app.heartbeats import (  # noqa: F401 - the writers and the check use the same keys
    PREFIX,
    ROLES,
    default_node,
    heartbeat_key,
    is_live,
    live_nodes,
    redis_now,
)

log = logging.getLogger(__name__)


class Heartbeat:
    """Every ``ttl_s / 3`` seconds, from a daemon thread, marks ``node`` alive for ``ttl_s``."""

    def __init__(self, client: redis.Redis, role: str, node: str, ttl_s: float):
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        if ttl_s < 3:
            raise ValueError("ttl_s must be at least 3 seconds")
        self.client = client
        self.key = heartbeat_key(role)
        self.node = node
        self.ttl_s = ttl_s
        self.interval_s = ttl_s / 3
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Mark the node alive once, dropping nodes long expired (raises ``redis.RedisError``)."""
        now = redis_now(self.client)
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(self.key, {self.node: now + self.ttl_s})
        pipe.zremrangebyscore(self.key, "-inf", now - 3600)  # keep killed nodes an hour, for a look
        pipe.pexpire(self.key, int(3600 * 1000))
        pipe.execute()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except redis.RedisError as exc:  # Redis down: readiness says so; keep trying
                log.warning("heartbeat not written key=%s error=%s", self.key, type(exc).__name__)
            self._stop.wait(self.interval_s)

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and remove the node, so a graceful shutdown shows at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
        with suppress(redis.RedisError):
            self.client.zrem(self.key, self.node)


def _client(url: str) -> redis.Redis:
    from app import redis_client

    return redis_client.from_url(url, socket_timeout=2, socket_connect_timeout=1)


_running: dict[str, Heartbeat] = {}


def start(role: str, node: str, redis_url: str, ttl_s: float) -> None:
    """Start this process's heartbeat (``worker.celery_app`` calls it on worker_ready/beat_init)."""
    _running[role] = Heartbeat(_client(redis_url), role, node, ttl_s).start()
    log.info("heartbeat started role=%s node=%s", role, node)


def stop(role: str) -> None:
    beat = _running.pop(role, None)
    if beat is not None:
        beat.stop()


# -- health check command ------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.observability.heartbeat")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="exit 0 when the heartbeat of this node is live")
    check.add_argument("role", choices=ROLES)
    check.add_argument("--node", help="node name (default: celery@HOST or beat@HOST)")
    args = parser.parse_args(argv)

    from app.config import ConfigError, get_settings

    try:
        url = get_settings().redis_url
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    node = args.node or default_node(args.role)
    try:
        live = is_live(_client(url), args.role, node)
    except redis.RedisError as exc:
        print(f"redis unreachable: {type(exc).__name__}", file=sys.stderr)
        return 1
    if not live:
        print(f"no live heartbeat for {args.role} {node}", file=sys.stderr)
        return 1
    print(f"{args.role} {node} alive")
    return 0


if __name__ == "__main__":
    sys.exit(main())
