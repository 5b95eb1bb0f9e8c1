"""The outbox sweeper: nothing accepted is lost when a task is.

Tasks vanish when Redis restarts (it keeps nothing on disk), when a publish failed while Redis
was down, or when a worker died holding one. Their rows are still in the database, ``queued`` or
``processing`` with an expired lease; the sweeper (Celery beat, every ``SWEEP_INTERVAL_S``)
publishes them again. A duplicate publish is harmless: the task is idempotent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta

from app.db import utcnow
from app.outbox import rows
from app.services import Services

log = logging.getLogger(__name__)


LOCK_KEY = "outbox:sweeper"


def lock_timeout_s(settings) -> float:
    """How long a sweeper's lock outlives it. The lock only saves duplicate publishes (which
    are harmless), while a sweeper killed mid-sweep (its worker SIGKILLed) leaves it behind and
    stops every sweep until it expires: so about one sweep interval, never a minute."""
    return max(5.0, settings.sweep_interval_s)


def sweep(services: Services, publish: Callable[[int], None]) -> list[int]:
    """Publish every stale row once; only one sweeper runs at a time (a Redis lock)."""
    lock = services.redis.lock(LOCK_KEY, timeout=lock_timeout_s(services.settings), blocking=False)
    if not lock.acquire():
        return []
    try:
        queued_before = utcnow() - timedelta(seconds=services.settings.sweep_queued_after_s)
        with services.db.reader() as session:  # publishing twice is harmless: a plain read
            ids = rows.stale_rows(session, queued_before)
        published = []
        for message_id in ids:
            try:
                publish(message_id)
            except Exception:  # noqa: BLE001 - broker still down: next sweep tries again
                log.warning("sweeper could not publish; will retry next sweep")
                break
            published.append(message_id)
        with services.db.session() as session:
            rows.mark_enqueued(session, published)
        if published:
            log.info("sweeper re-enqueued %d messages", len(published))
        return published
    finally:
        with contextlib.suppress(Exception):  # it expires by itself
            lock.release()
