"""Nothing accepted is lost: Redis down at accept time, dead workers' leases, database down."""

import time
from datetime import timedelta

import pytest
import redis
from sqlalchemy import select, update

from app import migrate
from app.db import utcnow
from app.models import InboundMessage, MessageStatus
from app.outbox.rows import ClaimResult, claim
from app.services import Services
from app.web.factory import create_app
from tests.support.callbacks import CallbackForger
from tests.support.env import make_env, redis_url, settings_from
from tests.support.stack import TempDatabase
from worker.celery_app import HANDLE_MESSAGE
from worker.sweeper import LOCK_KEY, lock_timeout_s, sweep

pytestmark = pytest.mark.integration

REDIS_DB = 13
DEAD_BROKER = "redis://127.0.0.1:1/0"


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path):
    db = TempDatabase(request.param, tmp_path)
    migrate.upgrade(db.url)
    yield db
    db.drop()


@pytest.fixture
def env(database):
    r = redis.Redis.from_url(redis_url(REDIS_DB))
    r.flushdb()
    yield make_env(DATABASE_URL=database.url, REDIS_URL=redis_url(REDIS_DB))
    r.flushdb()


def rows(services):
    with services.db.session() as session:
        return list(session.scalars(select(InboundMessage).order_by(InboundMessage.id)))


def test_broker_down_accepts_and_the_sweeper_enqueues_later(env):
    down = Services(settings_from(env, celery_broker_url=DEAD_BROKER))
    client = create_app(services=down).test_client()
    forger = CallbackForger(env)
    params, body = forger.request(forger.message_xml("Redis 挂了也不能丢"))
    started = time.perf_counter()
    response = client.post("/wecom/callback", query_string=params, data=body)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200 and response.data == b""
    assert elapsed < 4.0, "the callback must answer well inside WeCom's 5 s even with Redis down"
    [row] = rows(down)
    assert row.status == MessageStatus.QUEUED

    up = Services(settings_from(env, sweep_queued_after_s=0))
    published = sweep(up, lambda message_id: up.celery.send_task(HANDLE_MESSAGE, args=[message_id]))
    assert published == [row.id]
    assert up.redis.llen("chat") == 1  # the task is in the broker's queue now
    assert sweep(Services(settings_from(env, sweep_queued_after_s=3600)), lambda _: None) == []


def test_sweeper_takes_rows_of_dead_workers_but_not_live_ones(env):
    services = Services(settings_from(env, sweep_queued_after_s=3600))
    client = create_app(services=services).test_client()
    forger = CallbackForger(env)
    for text in ("a", "b"):
        params, body = forger.request(forger.message_xml(text))
        assert client.post("/wecom/callback", query_string=params, data=body).status_code == 200
    first, second = (r.id for r in rows(services))
    with services.db.session() as session:
        assert claim(session, first, "dead-worker", 60).result == ClaimResult.CLAIMED
        # the second waits behind the first: same user, arrival order
        assert claim(session, second, "other", 60).result == ClaimResult.WAIT_EARLIER
        session.execute(update(InboundMessage).where(InboundMessage.id == first)
                        .values(lease_until=utcnow() - timedelta(seconds=1)))
        session.commit()
    assert sweep(services, lambda _: None) == [first]
    with services.db.session() as session:
        rescued = claim(session, first, "rescuer", 60)
        assert rescued.result == ClaimResult.CLAIMED and rescued.row.attempts == 2


def test_a_sweeper_killed_mid_sweep_holds_the_others_off_for_one_interval_only(env):
    services = Services(settings_from(env, sweep_queued_after_s=0, sweep_interval_s=2))
    client = create_app(services=services).test_client()
    forger = CallbackForger(env)
    params, body = forger.request(forger.message_xml("清扫者被杀"))
    assert client.post("/wecom/callback", query_string=params, data=body).status_code == 200
    [row] = rows(services)
    # what a SIGKILLed sweeper leaves: its lock, never released
    assert services.redis.lock(LOCK_KEY, timeout=lock_timeout_s(services.settings)).acquire()
    assert sweep(services, lambda _: None) == []  # held off while the lock lives
    assert lock_timeout_s(services.settings) <= 5.0
    time.sleep(lock_timeout_s(services.settings) + 0.5)
    assert sweep(services, lambda _: None) == [row.id]


def test_duplicate_callback_is_one_row(env):
    services = Services(settings_from(env))
    client = create_app(services=services).test_client()
    forger = CallbackForger(env)
    xml = forger.message_xml("重复", msg_id="424242")
    for _ in range(3):
        params, body = forger.request(xml)  # WeCom's retry: same message, fresh signature
        assert client.post("/wecom/callback", query_string=params, data=body).status_code == 200
    assert len(rows(services)) == 1


def test_stored_row_holds_no_plaintext(env):
    services = Services(settings_from(env))
    client = create_app(services=services).test_client()
    forger = CallbackForger(env)
    # marks no encoding can spell by chance (hex and base64url have no 机, no '@'): a sealed value
    # or a blind index is random text, in which a short ASCII mark such as "4711" turned up once
    params, body = forger.request(forger.message_xml("SENTINEL-机密-4711", user="lina@sentinel"))
    assert client.post("/wecom/callback", query_string=params, data=body).status_code == 200
    [row] = rows(services)
    stored = " ".join(str(v) for v in vars(row).values())
    assert "机密" not in stored and "lina@sentinel" not in stored
    assert "SENTINEL-机密-4711" in services.cipher.decrypt(row.payload_enc, "inbound_messages", "payload_enc", row.id)


def test_database_down_answers_503_so_wecom_retries(env):
    dead = make_env(**{**env, "DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/none"})
    client = create_app(services=Services(settings_from(dead))).test_client()
    forger = CallbackForger(env)
    params, body = forger.request(forger.message_xml("db down"))
    response = client.post("/wecom/callback", query_string=params, data=body)
    assert response.status_code == 503
    assert "retry" in response.get_json()["error"]
