"""Celery tasks: thin wrappers that call the product's code (``worker.processor``).

The process's one processor (its services, WeCom client and model backend) is
``worker.runtime``'s; with the threads pool every task thread shares it.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.exceptions import Retry

from worker import runtime
from worker.celery_app import (
    AUDIT_CHECKPOINT,
    DATA_MAINTENANCE,
    HANDLE_MESSAGE,
    SIEM_EXPORT,
    SWEEP_OUTBOX,
)
from worker.sweeper import sweep

log = logging.getLogger(__name__)
MAX_WAITS = 1200  # behind an earlier message: look again for at most ~10 minutes


@shared_task(name=DATA_MAINTENANCE, acks_late=False)
def data_maintenance() -> dict:
    """Hourly: purge audit events past the retention (anchored), charge stale budget reservations,
    send again the budget alerts a dead worker left undelivered."""
    from contextlib import suppress

    from app.accounting import redeliver

    processor = runtime.processor()
    services = processor.services
    settings = services.settings
    lock = services.redis.lock("data:maintenance", timeout=600, blocking=False)
    if not lock.acquire():
        return {}
    try:
        purged = services.audit.purge(services.db, settings.audit_retention_days)
        charged = processor.meter.accounting.expire_reservations(settings.budget_reservation_ttl_s)
        resent = redeliver(services.db, services.alert_sender, settings.currency)
        if purged or charged or resent:
            log.info("data maintenance: purged %d audit events, charged %d expired reservations, "
                     "sent %d budget alerts again", purged, charged, resent)
        return {"purged": purged, "charged": charged, "alerts_resent": resent}
    finally:
        with suppress(Exception):  # the lock expires by itself
            lock.release()


@shared_task(name=AUDIT_CHECKPOINT, acks_late=False)
def audit_checkpoint() -> int:
    """Every AUDIT_CHECKPOINT_MINUTES: a sealed checkpoint event reseals the chain head."""
    services = runtime.processor().services
    return services.audit.checkpoint(services.db)


@shared_task(name=SIEM_EXPORT, acks_late=False)
def siem_export() -> dict:
    """Every SIEM_INTERVAL_S: audit events and spend past each SIEM sink's cursor (app.siem)."""
    from app.siem import export_once

    return export_once(runtime.processor().services).as_dict()


@shared_task(bind=True, name=HANDLE_MESSAGE, max_retries=None, acks_late=True)
def handle_message(self, message_id: int) -> None:
    outcome = runtime.processor().process(int(message_id))
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
    return len(sweep(runtime.processor().services, lambda message_id: handle_message.delay(message_id)))
