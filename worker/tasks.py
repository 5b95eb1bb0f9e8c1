"""Celery tasks: thin wrappers that call the product's code (``worker.processor``).

One ``Runtime`` per worker process holds the services, the WeCom client and the model backend;
with the threads pool every task thread shares it, so concurrent chats share one engine.
"""

from __future__ import annotations

import logging
import threading

from celery import shared_task
from celery.exceptions import Retry

from app.config import get_settings
from app.llm import make_backend
from app.services import Services
from worker.celery_app import AUDIT_CHECKPOINT, DATA_MAINTENANCE, HANDLE_MESSAGE, SWEEP_OUTBOX
from worker.conversation import ConversationStore
from worker.processor import MessageProcessor
from worker.sweeper import sweep

log = logging.getLogger(__name__)
_runtime: MessageProcessor | None = None
_runtime_lock = threading.Lock()
MAX_WAITS = 1200  # behind an earlier message: look again for at most ~10 minutes


def build_processor(services: Services) -> MessageProcessor:
    s = services.settings
    conversations = ConversationStore(services.redis, services.cipher, s.conversation_ttl_s,
                                      s.conversation_max_messages)
    return MessageProcessor(services, None, services.wecom, conversations,
                            llm_factory=make_backend)


def runtime() -> MessageProcessor:
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = build_processor(Services(get_settings()))
    return _runtime


@shared_task(name=DATA_MAINTENANCE, acks_late=False)
def data_maintenance() -> dict:
    """Hourly: purge audit events past the retention (anchored), charge stale budget reservations."""
    from contextlib import suppress

    processor = runtime()
    services = processor.services
    settings = services.settings
    lock = services.redis.lock("data:maintenance", timeout=600, blocking=False)
    if not lock.acquire():
        return {}
    try:
        purged = services.audit.purge(services.db, settings.audit_retention_days)
        charged = processor.meter.accounting.expire_reservations(settings.budget_reservation_ttl_s)
        if purged or charged:
            log.info("data maintenance: purged %d audit events, charged %d expired reservations",
                     purged, charged)
        return {"purged": purged, "charged": charged}
    finally:
        with suppress(Exception):  # the lock expires by itself
            lock.release()


@shared_task(name=AUDIT_CHECKPOINT, acks_late=False)
def audit_checkpoint() -> int:
    """Every AUDIT_CHECKPOINT_MINUTES: a sealed checkpoint event reseals the chain head."""
    return runtime().services.audit.checkpoint(runtime().services.db)


@shared_task(bind=True, name=HANDLE_MESSAGE, max_retries=None, acks_late=True)
def handle_message(self, message_id: int) -> None:
    outcome = runtime().process(int(message_id))
    if not outcome.retry:
        return
    waits = self.request.retries
    if outcome.status == "wait" and waits >= MAX_WAITS:
        log.warning("still behind an earlier message, leaving it to the sweeper message_id=%s", message_id)
        return
    try:
        raise self.retry(countdown=outcome.countdown)
    except Retry:
        raise
    except Exception:  # noqa: BLE001 - broker down: the row is queued and the sweeper has it
        log.warning("could not schedule the retry message_id=%s", message_id)


@shared_task(name=SWEEP_OUTBOX, acks_late=False)
def sweep_outbox() -> int:
    """Re-enqueue rows that nobody works on (lost tasks, dead workers, Redis restarts)."""
    return len(sweep(runtime().services, lambda message_id: handle_message.delay(message_id)))
