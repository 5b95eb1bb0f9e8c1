"""``/healthz`` and ``/readyz`` in-process against real Redis (DB 6) and real databases, and the
worker heartbeat itself: readiness names exactly what is down."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
import redis

from app.web.factory import create_app
from tests.support import postgres
from tests.support.env import make_env, redis_url, settings_from
from tests.support.stack import ROOT, TempDatabase, free_port, wait_for
from worker.observability.heartbeat import (
    Heartbeat,
    default_node,
    heartbeat_key,
    live_nodes,
    redis_now,
)

pytestmark = pytest.mark.integration
REDIS_URL = redis_url(6)


@pytest.fixture
def r():
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()


def client_for(tmp_path, **env):
    values = {"DATABASE_URL": f"sqlite:///{tmp_path / 'bot.sqlite3'}", "REDIS_URL": REDIS_URL, **env}
    return create_app(settings_from(make_env(**values))).test_client()


def closed_port_url(scheme: str) -> str:
    return f"{scheme}://127.0.0.1:{free_port()}/0"


def test_healthz_needs_no_dependency(tmp_path):
    client = client_for(tmp_path, REDIS_URL=closed_port_url("redis"),
                        DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none")
    resp = client.get("/healthz")
    assert resp.status_code == 200
    assert resp.get_json() == {"status": "ok"}


def test_readyz_ok_when_database_redis_and_a_worker_are_up(tmp_path, r):
    Heartbeat(r, "worker", "celery@test-node", ttl_s=30).beat()
    resp = client_for(tmp_path).get("/readyz")
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["status"] == "ok"
    assert body["checks"] == {"database": "ok", "redis": "ok", "worker": "ok"}
    assert body["workers"] == 1
    assert "down" not in body


def test_readyz_names_the_worker_when_no_heartbeat(tmp_path, r):
    resp = client_for(tmp_path).get("/readyz")
    assert resp.status_code == 503
    body = resp.get_json()
    assert body["status"] == "unavailable"
    assert body["down"] == ["worker"]
    assert body["checks"] == {"database": "ok", "redis": "ok", "worker": "down"}


def test_readyz_names_redis_when_unreachable(tmp_path, r):
    Heartbeat(r, "worker", "celery@test-node", ttl_s=30).beat()  # in another Redis than the app's
    resp = client_for(tmp_path, REDIS_URL=closed_port_url("redis")).get("/readyz")
    assert resp.status_code == 503
    body = resp.get_json()
    assert body["down"] == ["redis"]
    assert body["checks"] == {"database": "ok", "redis": "down", "worker": "unknown"}


def test_readyz_names_the_database_when_unreachable(tmp_path, r):
    Heartbeat(r, "worker", "celery@test-node", ttl_s=30).beat()
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none"
    resp = client_for(tmp_path, DATABASE_URL=url).get("/readyz")
    assert resp.status_code == 503
    body = resp.get_json()
    assert body["down"] == ["database"]
    assert body["checks"]["redis"] == "ok" and body["checks"]["worker"] == "ok"
    assert "127.0.0.1" not in resp.get_data(as_text=True)  # no error text in the body


def test_readyz_on_postgresql(tmp_path, r):
    try:
        db = TempDatabase("postgres", tmp_path)
    except psycopg.OperationalError as exc:
        postgres.unreachable(exc)
    try:
        Heartbeat(r, "worker", "celery@test-node", ttl_s=30).beat()
        resp = client_for(tmp_path, DATABASE_URL=db.url).get("/readyz")
        assert resp.status_code == 200, resp.get_json()
    finally:
        db.drop()


def test_heartbeat_marks_the_node_alive_for_its_ttl_and_stop_removes_it(r):
    beat = Heartbeat(r, "worker", "celery@hb", ttl_s=9)
    beat.beat()
    expires = r.zscore(heartbeat_key("worker"), "celery@hb")
    assert 0 < expires - redis_now(r) <= 9
    assert live_nodes(r, "worker") == ["celery@hb"]

    beat.stop()
    assert live_nodes(r, "worker") == []


def test_an_expired_heartbeat_is_not_live(r):
    Heartbeat(r, "worker", "celery@alive", ttl_s=30).beat()
    r.zadd(heartbeat_key("worker"), {"celery@killed": redis_now(r) - 1})  # as a killed worker leaves it
    assert live_nodes(r, "worker") == ["celery@alive"]


def test_heartbeat_thread_keeps_pushing_the_expiry(r):
    beat = Heartbeat(r, "beat", "beat@hb", ttl_s=3).start()
    try:
        wait_for(lambda: live_nodes(r, "beat") == ["beat@hb"], 10, what="first heartbeat")
        first = r.zscore(heartbeat_key("beat"), "beat@hb")
        wait_for(lambda: (r.zscore(heartbeat_key("beat"), "beat@hb") or 0) > first, 10,
                 what="a refreshed heartbeat")
    finally:
        beat.stop()
    assert live_nodes(r, "beat") == []


def test_heartbeat_rejects_bad_arguments(r):
    with pytest.raises(ValueError, match="role"):
        Heartbeat(r, "web", "x", ttl_s=30)
    with pytest.raises(ValueError, match="ttl_s"):
        Heartbeat(r, "worker", "x", ttl_s=1)


def test_default_node_is_celerys_own_default():
    from celery.utils.nodenames import default_nodename

    assert default_node("worker") == default_nodename(None)  # what the health check looks for


def test_check_command_exit_status(r):
    env = {**os.environ, **make_env(REDIS_URL=REDIS_URL)}
    argv = [sys.executable, "-m", "worker.observability.heartbeat", "check", "worker", "--node", "celery@cli"]
    missing = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    assert missing.returncode == 1
    assert "no live heartbeat for worker celery@cli" in missing.stderr

    Heartbeat(r, "worker", "celery@cli", ttl_s=30).beat()
    live = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    assert live.returncode == 0, live.stderr
