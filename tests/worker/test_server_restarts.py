"""Redis and PostgreSQL restarted under a running stack (private servers, never the shared ones).

Redis keeps nothing on disk here, so a restart loses every queued task: the outbox rows are
still in the database and the sweeper publishes them again. The Celery worker rides the restart
out in-process: it reconnects instead of exiting (worker/broker_fixes.py). While PostgreSQL is down the
callback cannot store a message, so it answers 503 and WeCom (the emulator) retries until the
database is back; nothing is answered twice.
"""

import threading
import time

import pytest

from tests.support.faults import answered_once, wait_answered
from tests.support.servers import PrivatePostgres, PrivateRedis
from tests.support.stack import Stack, wait_for

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def servers():
    redis_server = PrivateRedis().start()
    pg = PrivatePostgres().start()
    yield redis_server, pg
    redis_server.close()
    pg.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, servers):
    redis_server, pg = servers
    pg_admin = pg.url.replace("postgresql+psycopg", "postgresql")
    s = Stack(tmp_path_factory.mktemp("restarts"), db_kind="postgres", redis_url=redis_server.url(0),
              pg_admin=pg_admin, model_delay_s=0.3,
              extra_env={"SWEEP_QUEUED_AFTER_S": "3", "CLAIM_LEASE_S": "4"}).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def users(stack):
    return [u["userid"] for u in stack.emu("GET", "directory")["users"]]


def test_redis_restarted_while_messages_arrive_loses_nothing(stack, servers, users):
    redis_server, _ = servers
    expected: dict[str, list[str]] = {}
    for i in range(16):
        expected.setdefault(users[i % 4], []).append(f"redis 重启 {i}")

    def arrive():
        for i, (user, text) in enumerate((u, t) for u, ts in expected.items() for t in ts):
            stack.send(user, text, wait=True)
            if i % 4 == 3:
                time.sleep(0.5)

    worker_pid = stack.procs["worker"].pid
    sender = threading.Thread(target=arrive)
    sender.start()
    time.sleep(1.0)
    redis_server.stop()  # queued tasks, the token cache and conversations are gone
    time.sleep(2.0)
    redis_server.start()
    sender.join(timeout=120)

    wait_answered(stack, expected, timeout=120)
    wait_for(lambda: all(r["status"] == "answered" for r in stack.outbox_rows()), timeout=60,
             what="every row answered")
    assert len(stack.outbox_rows()) == 16  # every message accepted once, WeCom's retries deduplicated
    assert answered_once(stack, expected) == {}
    assert stack.emu("GET", "stats")["apis"]["message/send"]["delivered"] == 16
    assert "sweeper re-enqueued" in stack.log("worker")
    # The worker reconnected in-process (worker/broker_fixes.py): it did not exit and restart.
    assert stack.procs["worker"].pid == worker_pid and stack.procs["worker"].poll() is None
    assert stack.log("worker").count("Connected to redis") >= 2
    assert "Unrecoverable error" not in stack.log("worker")


def test_postgres_restarted_callback_answers_503_then_everything_is_answered(stack, servers, users):
    _, pg = servers
    stack.emu("POST", "config", json={"retries": 60, "retry_interval": 1.0})
    before = len(stack.outbox_rows())
    expected = {user: [f"数据库重启 {user}"] for user in users[4:8]}
    pg.stop()
    try:
        first = [stack.send(user, texts[0], wait=True)["first_attempt"] for user, texts in expected.items()]
        assert [attempt["status_code"] for attempt in first] == [503] * len(first)
    finally:
        pg.start()
    wait_answered(stack, expected, timeout=120)
    wait_for(lambda: all(r["status"] == "answered" for r in stack.outbox_rows()), timeout=60,
             what="every row answered")
    assert len(stack.outbox_rows()) == before + len(expected)
    assert answered_once(stack, expected) == {}
    codes = {a["status_code"] for a in stack.emu("GET", "callbacks")["attempts"]}
    assert 503 in codes and 500 not in codes
