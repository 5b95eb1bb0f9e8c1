"""Readiness of the real stack: the Celery worker's and beat's own heartbeats make ``/readyz``
pass through gunicorn, and a worker's graceful shutdown makes it fail naming the worker."""

from __future__ import annotations

import signal

import pytest
import requests

from tests.support.stack import Stack, wait_for
from worker.observability.heartbeat import live_nodes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack-health"), db_kind="sqlite", redis_db=6).start()
    yield s
    s.stop()


def readyz(stack: Stack) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{stack.web_port}/readyz", timeout=10)


def test_worker_and_beat_heartbeats_make_the_stack_ready(stack):
    resp = wait_for(lambda: (r := readyz(stack)).status_code == 200 and r, 30, what="readyz 200")
    body = resp.json()
    assert body["checks"] == {"database": "ok", "redis": "ok", "worker": "ok"}
    assert body["workers"] == 1
    assert len(live_nodes(stack.redis, "worker")) == 1
    wait_for(lambda: len(live_nodes(stack.redis, "beat")) == 1, 30, what="beat heartbeat")


def test_graceful_worker_shutdown_makes_readyz_name_the_worker(stack):
    wait_for(lambda: live_nodes(stack.redis, "worker"), 30, what="worker heartbeat")
    stack.kill("worker", signal.SIGTERM)  # waits for the process to exit

    resp = readyz(stack)
    assert resp.status_code == 503
    assert resp.json()["down"] == ["worker"]
    assert live_nodes(stack.redis, "worker") == []

    stack.start_worker()  # a fresh worker makes it ready again
    wait_for(lambda: readyz(stack).status_code == 200, 60, what="readyz after restart")
