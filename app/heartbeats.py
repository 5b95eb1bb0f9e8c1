"""The worker's and beat's heartbeats as Redis holds them: how they are keyed and read.

The worker and beat write them (``worker/observability/heartbeat.py``: a thread pushing each
node's expiry forward); ``/readyz`` reads them here, with Redis alone: the web process never imports the
worker. One sorted set per role (``heartbeat:worker``: node -> expiry, on Redis's clock) is read
in one command however many other keys Redis holds.
"""

from __future__ import annotations

import socket

import redis

PREFIX = "heartbeat"
ROLES = ("worker", "beat")


def heartbeat_key(role: str) -> str:
    """A sorted set per role: member = node name, score = when its heartbeat expires."""
    return f"{PREFIX}:{role}"


def default_node(role: str) -> str:
    """The node name Celery gives a worker started without ``-n`` (and the same form for beat)."""
    return f"{'celery' if role == 'worker' else 'beat'}@{socket.gethostname()}"


def redis_now(client: redis.Redis) -> float:
    # Redis's clock, for writers and readers alike: containers' clocks may disagree.
    seconds, micros = client.time()
    return seconds + micros / 1e6


def live_nodes(client: redis.Redis, role: str) -> list[str]:
    """Nodes of ``role`` whose heartbeat has not expired (raises ``redis.RedisError``)."""
    members = client.zrangebyscore(heartbeat_key(role), f"({redis_now(client)}", "+inf")
    return sorted(m.decode() if isinstance(m, bytes) else m for m in members)


def is_live(client: redis.Redis, role: str, node: str) -> bool:
    expires = client.zscore(heartbeat_key(role), node)
    return expires is not None and expires > redis_now(client)
