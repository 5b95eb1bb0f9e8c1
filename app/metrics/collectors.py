"""Scrape-time collectors: values read when Prometheus asks, not counted as events happen.

The Celery queue's length is a Redis ``LLEN`` (plus kombu's priority sub-queues), the messages
a worker holds but has not acknowledged are kombu's ``unacked`` hash, and the spend per budget
is one indexed query over the enabled budgets and their current period rows. Each scrape costs
a few round trips; a failing source is left out of that scrape (and logged), never a 500.
"""

from __future__ import annotations

import logging
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import and_, or_, select

from app.accounting import period_start
from app.db import utcnow
from app.models import Budget, BudgetPeriod

log = logging.getLogger(__name__)
# kombu's Redis transport keeps priorities 3, 6 and 9 in sub-lists named queue + SEP + priority.
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)
UNACKED_KEY = "unacked"


class QueueDepthCollector(Collector):
    """``wecom_bot_queue_depth{queue}`` and ``wecom_bot_queue_unacked`` from the broker."""

    def __init__(self, redis, queues: tuple[str, ...] = ("chat",)):
        self.redis = redis
        self.queues = queues

    def collect(self):
        try:
            pipe = self.redis.pipeline(transaction=False)
            for queue in self.queues:
                pipe.llen(queue)
                for step in PRIORITY_STEPS:
                    pipe.llen(f"{queue}{PRIORITY_SEP}{step}")
            pipe.hlen(UNACKED_KEY)
            counts = pipe.execute()
        except Exception:  # noqa: BLE001 - no broker: leave the series out of this scrape
            log.warning("queue depth not collected: broker unavailable")
            return
        depth = GaugeMetricFamily("wecom_bot_queue_depth",
                                  "Tasks waiting in the Celery queue (not yet taken by a worker)",
                                  labels=["queue"])
        per_queue = 1 + len(PRIORITY_STEPS)
        for index, queue in enumerate(self.queues):
            depth.add_metric([queue], sum(counts[index * per_queue:(index + 1) * per_queue]))
        yield depth
        yield GaugeMetricFamily("wecom_bot_queue_unacked",
                                "Tasks taken by a worker and not yet acknowledged",
                                value=counts[-1])


class AmqpQueueDepthCollector(Collector):
    """``wecom_bot_queue_depth{queue}`` from RabbitMQ: a passive declare gives the ready
    messages (RabbitMQ counts the unacknowledged ones apart; they are not reported here)."""

    def __init__(self, broker_url: str, queues: tuple[str, ...] = ("chat",)):
        self.broker_url = broker_url
        self.queues = queues

    def collect(self):
        from kombu import Connection

        try:
            with Connection(self.broker_url, connect_timeout=2) as connection:
                channel = connection.default_channel
                counts = [channel.queue_declare(queue, passive=True).message_count for queue in self.queues]
        except Exception:  # noqa: BLE001 - no broker (or no queue yet): leave the series out
            log.warning("queue depth not collected: broker unavailable")
            return
        depth = GaugeMetricFamily("wecom_bot_queue_depth",
                                  "Tasks waiting in the Celery queue (not yet taken by a worker)",
                                  labels=["queue"])
        for queue, count in zip(self.queues, counts, strict=True):
            depth.add_metric([queue], count)
        yield depth


class BudgetSpendCollector(Collector):
    """``wecom_bot_budget_spent`` / ``_reserved`` / ``_limit`` per enabled budget, this period."""

    LABELS = ["budget_id", "scope", "period", "currency"]

    def __init__(self, db, tz, now=utcnow):
        self.db, self.tz, self.now = db, tz, now

    def collect(self):
        try:
            rows = self._current()
        except Exception:  # noqa: BLE001 - no database: leave the series out of this scrape
            log.warning("budget spend not collected: database unavailable")
            return
        spent = GaugeMetricFamily("wecom_bot_budget_spent",
                                  "Spend charged to the budget in its current period",
                                  labels=self.LABELS)
        reserved = GaugeMetricFamily("wecom_bot_budget_reserved",
                                     "Spend held for model calls still running", labels=self.LABELS)
        limit = GaugeMetricFamily("wecom_bot_budget_limit", "The budget's limit per period",
                                  labels=self.LABELS)
        for budget, period in rows:
            labels = [str(budget.id), budget.scope, budget.period, budget.currency]
            spent.add_metric(labels, float(period.spent) if period else 0.0)
            reserved.add_metric(labels, float(period.reserved) if period else 0.0)
            limit.add_metric(labels, float(budget.limit))
        yield from (spent, reserved, limit)

    def _current(self) -> list:
        now: datetime = self.now()
        starts = {p: period_start(p, now, self.tz) for p in ("day", "week", "month")}
        current = or_(*[and_(Budget.period == p, BudgetPeriod.period_start == s)
                        for p, s in starts.items()])
        with self.db.reader() as session:
            return list(session.execute(
                select(Budget, BudgetPeriod)
                .outerjoin(BudgetPeriod, and_(BudgetPeriod.budget_id == Budget.id, current))
                .where(Budget.enabled.is_(True)).order_by(Budget.id)))
