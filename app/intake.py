"""Group commit for the callbacks: messages that arrive together are written together.

Every accepted message is an outbox row and a ``message_received`` audit event, committed in
one transaction before WeCom hears 200. One transaction per message made the callbacks queue on
the database's single write lock (SQLite) or the audit chain's head row (PostgreSQL), each
holder paying its own BEGIN, statement round trips and commit. So each web process has one
writer thread (``app.batching``): a request thread hands it its message and waits; the writer
takes everything that is waiting (up to ``max_batch``), writes it with one statement per kind,
commits, and wakes them. A lone message waits for nobody; it is written as soon as the writer
is free.

The new rows' tasks are published after the commit by a second thread, all that wait in one
Redis round trip: the row is durable when WeCom hears 200, so the acknowledgement does not wait
for Redis, and a broker that is down or slow leaves the rows queued for the sweeper (the
process dying between the commit and the publish does too) instead of holding the callbacks.

A batch that fails for another reason than the database being unreachable is retried one
message at a time, so one bad message cannot refuse the others. A caller that waited
``timeout_s`` in vain gets ``IntakeUnavailable`` (the callback answers 503 and WeCom retries);
its message is dropped if the writer has not reached it yet, and if the write was already under
way and commits, the retry is a duplicate and the sweeper enqueues the row.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError, OperationalError

from app import metrics
from app.audit import Event, EventType
from app.batching import BatchThread
from app.outbox import Accepted, Arrival, accept_many, user_hash
from worker.celery_app import HANDLE_MESSAGE

log = logging.getLogger(__name__)


class IntakeUnavailable(Exception):
    """The message was not (known to be) written: answer 503 so that WeCom retries."""


@dataclass(eq=False)
class _Pending:
    arrival: Arrival
    fingerprint: str | None
    done: threading.Event = field(default_factory=threading.Event)
    result: Accepted | None = None
    error: BaseException | None = None
    abandoned: bool = False  # the caller stopped waiting (and answered 503): not worth writing


class Intake:
    def __init__(self, services, max_batch: int = 64, timeout_s: float = 3.0, idle_s: float = 30.0):
        self.services = services
        self.timeout_s = timeout_s
        self._writer = BatchThread("callback-intake", self._write_batch, max_batch, idle_s)
        self._publisher = BatchThread("callback-publish", self._publish, 256, idle_s)

    def accept(self, arrival: Arrival, fingerprint: str | None = None) -> Accepted:
        """Write ``arrival`` (and its audit event, when it is new) and return its row. A new
        row's task is published after the commit, unless ``arrival.enqueue`` is false."""
        pending = _Pending(arrival, fingerprint)
        self._writer.put(pending)
        if not pending.done.wait(self.timeout_s):
            pending.abandoned = True
            holder = self.services.db.writer_holder()
            waited = f" (SQLite writer turn held by {holder})" if holder else ""
            raise IntakeUnavailable(f"not written within {self.timeout_s:g} s{waited}")
        if pending.error is not None:
            raise IntakeUnavailable(f"not written: {type(pending.error).__name__}") from pending.error
        return pending.result

    # -- the writer thread -----------------------------------------------------------------------
    def _write_batch(self, batch: list[_Pending]) -> None:
        batch = [pending for pending in batch if not pending.abandoned]
        if not batch:
            return
        try:
            self._write(batch)
        except BaseException as exc:  # never leave a caller waiting for a dead thread
            for pending in batch:
                if not pending.done.is_set():
                    pending.error = exc
                    pending.done.set()
            raise

    def _write(self, batch: list[_Pending]) -> None:
        try:
            results = self._commit(batch)
        except Exception as exc:
            database_down = isinstance(exc, OperationalError) or (
                isinstance(exc, DBAPIError) and exc.connection_invalidated)
            if len(batch) > 1 and not database_down:
                for pending in batch:
                    self._write([pending])
                return
            log.warning("outbox write failed for %d message(s): %s", len(batch), type(exc).__name__)
            for pending in batch:
                pending.error = exc
                pending.done.set()
            return
        metrics.CALLBACK_BATCH.observe(len(batch))
        for pending, accepted in zip(batch, results, strict=True):
            pending.result = accepted
            pending.done.set()
        for pending, accepted in zip(batch, results, strict=True):
            if accepted.created and pending.arrival.enqueue:
                self._publisher.put((accepted.id, pending.arrival.request_id))

    def _commit(self, batch: list[_Pending]) -> list[Accepted]:
        services = self.services
        # A Core transaction: the ORM session's bookkeeping cost about 0.2 ms a batch here.
        with services.db.engine.begin() as connection:
            results = accept_many(connection, services.cipher, services.blind_index,
                                  [pending.arrival for pending in batch])
            services.audit.append_many(connection, [
                received_event(services, pending, accepted)
                for pending, accepted in zip(batch, results, strict=True) if accepted.created])
        return results

    # -- the publisher thread --------------------------------------------------------------------
    def _publish(self, tasks: list[tuple[int, str | None]]) -> None:
        """One Redis round trip for every task waiting; on a broker failure the rows stay
        queued and the sweeper enqueues them."""
        try:
            self.services.publisher.send_many(HANDLE_MESSAGE, [
                ([message_id], {"request_id": request_id} if request_id else None)
                for message_id, request_id in tasks])
        except Exception as exc:  # noqa: BLE001 - any broker failure leaves the rows to the sweeper
            log.warning("enqueue failed for %d message(s), left for the sweeper: %s",
                        len(tasks), type(exc).__name__)


def received_event(services, pending: _Pending, accepted: Accepted) -> Event:
    message = pending.arrival.message
    return Event(
        EventType.MESSAGE_RECEIVED, actor=user_hash(services.blind_index, message.from_user),
        outcome="accepted", request_id=pending.arrival.request_id, fingerprint=pending.fingerprint,
        payload={"message_id": accepted.id, "msg_type": message.msg_type,
                 "event": getattr(message, "event", None), "agent_id": getattr(message, "agent_id", None)})
