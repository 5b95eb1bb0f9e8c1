"""Scrape-time collectors, the /metrics endpoint and the rate limits, on real Redis and databases.

Redis DB 5 is this file's (the other data tests use 14).
"""

from decimal import Decimal

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import func, select

from app import ratelimit
from app.accounting import set_budget
from app.metrics.collectors import BudgetSpendCollector, QueueDepthCollector
from app.models import InboundMessage, UsageRecord
from app.services import Services
from app.web.factory import create_app
from app.wecom.exceptions import WeComTransientError
from tests.support.env import make_env, redis_url
from tests.worker.test_processor_data import (
    SENTINEL_REPLY,
    FakeLLM,
    FakeWeCom,
    ids_of,
    post_message,
)
from worker.conversation import ConversationStore
from worker.delivery.reply import RATE_LIMIT_NOTICE
from worker.processor import MessageProcessor
from worker.user_limit import UserRateLimit

REDIS_URL = redis_url(5)
TOKEN = "scrape-token-0123456789"


class _BrokenRedis:
    def pipeline(self, *a, **k):
        raise redis.ConnectionError("down")

    def set(self, *a, **k):
        raise redis.ConnectionError("down")


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def env(database_url):
    return make_env(DATABASE_URL=database_url, REDIS_URL=REDIS_URL, METRICS_TOKEN=TOKEN,
                    WECOM_USER_RATE_LIMIT="2/min")


def exposition(*collectors) -> str:
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry).decode()


def test_queue_depth_counts_the_queue_its_priorities_and_unacked(redis_client):
    redis_client.rpush("chat", "a", "b", "c")
    redis_client.rpush("chat\x06\x166", "d")
    redis_client.hset("unacked", mapping={"t1": "x", "t2": "y"})
    text = exposition(QueueDepthCollector(redis_client))
    assert 'wecom_bot_queue_depth{queue="chat"} 4.0' in text
    assert "wecom_bot_queue_unacked 2.0" in text


def test_queue_depth_without_a_broker_is_left_out_not_an_error():
    assert "wecom_bot_queue_depth" not in exposition(QueueDepthCollector(_BrokenRedis()))


def test_budget_spend_is_the_current_period_of_each_enabled_budget(settings, db):
    from app.accounting import Accounting

    with db.transaction() as session:
        monthly = set_budget(session, "global", "", "month", Decimal("100"))
        daily = set_budget(session, "department", "7", "day", Decimal("10"))
        monthly_id, daily_id = monthly.id, daily.id
    accounting = Accounting(db, settings.timezone)
    admission = accounting.reserve("u" * 64, "7", "glm", 100, 100)
    from app.accounting import Usage

    accounting.settle(admission, Usage(user_hash="u" * 64, department="7", model="glm",
                                       prompt_tokens=100, completion_tokens=100))
    text = exposition(BudgetSpendCollector(db, settings.timezone))
    assert f'wecom_bot_budget_limit{{budget_id="{monthly_id}",currency="CNY",period="month",scope="global"}} 100.0' in text
    assert f'wecom_bot_budget_limit{{budget_id="{daily_id}",currency="CNY",period="day",scope="department"}} 10.0' in text
    assert f'wecom_bot_budget_spent{{budget_id="{daily_id}"' in text
    assert 'scope_value' not in text  # a user budget's label would be the user's blind index


@pytest.fixture
def client(settings, db, redis_client):
    app = create_app(services=Services(settings, db))
    app.config["TESTING"] = True
    return app.test_client()


def test_metrics_from_loopback_or_with_the_token_only(client):
    assert client.get("/metrics").status_code == 200  # the test client is 127.0.0.1
    remote = {"REMOTE_ADDR": "203.0.113.9"}
    assert client.get("/metrics", environ_base=remote).status_code == 403
    assert client.get("/metrics", environ_base=remote,
                      headers={"Authorization": "Bearer nope"}).status_code == 401
    ok = client.get("/metrics", environ_base=remote, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.headers["Content-Type"].startswith("text/plain")
    assert "wecom_bot_queue_depth{" in ok.text and "wecom_bot_budget_limit{" not in ok.text


def _count(client, series: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_rejected_callbacks_are_counted_by_reason(client):
    series = 'wecom_bot_callbacks_total{outcome="rejected",reason="missing_param"}'
    before = _count(client, series)
    assert client.post("/wecom/callback").status_code == 400
    assert _count(client, series) == before + 1


def test_sliding_window_counts_each_message_once(redis_client):
    now = 1_000_000.0
    verdicts = [ratelimit.sliding_window(redis_client, "t", str(i), 3, 60, now + i) for i in range(5)]
    assert [v.allowed for v in verdicts] == [True, True, True, False, False]
    assert verdicts[3].retry_after_s == 57  # the first one leaves the window 60 s after it came
    # Asking again for a counted message (a retried task) gives the same answer.
    assert ratelimit.sliding_window(redis_client, "t", "1", 3, 60, now + 10).allowed
    assert not ratelimit.sliding_window(redis_client, "t", "4", 3, 60, now + 10).allowed
    # A minute later the window has room again.
    assert ratelimit.sliding_window(redis_client, "t", "9", 3, 60, now + 61).allowed
    assert ratelimit.sliding_window(_BrokenRedis(), "t", "x", 0, 60, now).allowed  # fail open


def test_user_limit_notices_once_per_window_and_keys_by_blind_index(redis_client):
    limit = UserRateLimit(redis_client, 2, 60)
    user_hash = "h" * 64
    assert [limit.check(user_hash, i) for i in range(1, 6)] == [None, None, True, False, False]
    assert limit.check("other" * 8, 1) is None
    assert all(user_hash in key.decode() or "other" in key.decode() for key in redis_client.scan_iter())
    assert UserRateLimit(redis_client, 0, 60).check(user_hash, 99) is None  # 0 = off


class FlakyWeCom(FakeWeCom):
    """Loses the n-th send (transient), like a WeCom 5xx."""

    def __init__(self, fail_at: int):
        super().__init__()
        self.attempts, self.fail_at = 0, fail_at

    def send(self, touser, kind, content, **kwargs):
        self.attempts += 1
        if self.attempts == self.fail_at:
            raise WeComTransientError(-1, "system busy")
        return super().send(touser, kind, content, **kwargs)


def test_over_the_limit_one_notice_survives_a_retry_no_model_no_usage(services, monkeypatch):
    client = create_app(services=services).test_client()
    for i in range(5):
        assert post_message(client, services, f"question {i}", 100 + i).status_code == 200
    llm, wecom = FakeLLM(), FlakyWeCom(fail_at=3)  # the third send is the notice
    processor = MessageProcessor(services, llm, wecom,
                                 ConversationStore(services.redis, services.cipher, 3600, 20))
    first, _, third, _, _ = ids_of(services)
    # The first task drains the user's queue in order until the notice's send is lost ...
    assert processor.process(first).status == "done"
    # ... and the retried task sends the stored notice, then drains the rest without a reply.
    assert processor.process(third).status == "done"
    assert llm.calls == 2
    assert [content for _, _, content in wecom.sent] == [SENTINEL_REPLY, SENTINEL_REPLY,
                                                        RATE_LIMIT_NOTICE]
    with services.db.session() as session:
        rows = list(session.scalars(select(InboundMessage).order_by(InboundMessage.id)))
        assert [r.status for r in rows] == ["answered", "answered", "rate_limited", "rate_limited",
                                            "rate_limited"]
        assert rows[2].failure_reason == "rate limited: over 2 per 60s"
        assert "notice already sent" in rows[3].failure_reason
        assert session.scalar(select(func.count()).select_from(UsageRecord)) == 2
