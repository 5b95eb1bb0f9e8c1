"""Group commit for the callbacks: messages that arrive together are written together.

Every accepted message is an outbox row and a ``message_received`` audit event, committed in
one transaction before WeCom hears 200. One transaction per message made the callbacks queue on
the database's single write lock (SQLite) or the audit chain's head row (PostgreSQL), each
holder paying its own BEGIN, statement round trips and commit. So each web process has one
writer thread: a request thread hands it its message and waits; the writer takes everything
that is waiting (up to ``max_batch``), writes it with one statement per kind, commits, and wakes
them. A lone message waits for nobody; it is written as soon as the writer is free.

A batch that fails for another reason than the database being unreachable is retried one
message at a time, so one bad message cannot refuse the others. A caller that waited
``timeout_s`` in vain gets ``IntakeUnavailable`` (the callback answers 503 and WeCom retries);
its message is dropped if the writer has not reached it yet, and if the write was already under
way and commits, the retry is a duplicate and the sweeper enqueues the row.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError, OperationalError

from app import metrics
from app.audit import Event, EventType
from app.outbox import Accepted, Arrival, accept_many, user_hash

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
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None

    def accept(self, arrival: Arrival, fingerprint: str | None = None) -> Accepted:
        """Write ``arrival`` (and its audit event, when it is new) and return its row."""
        pending = _Pending(arrival, fingerprint)
        self._hand_over(pending)
        if not pending.done.wait(self.timeout_s):
            pending.abandoned = True
            raise IntakeUnavailable(f"not written within {self.timeout_s:g} s")
        if pending.error is not None:
            raise IntakeUnavailable(f"not written: {type(pending.error).__name__}") from pending.error
        return pending.result

    # -- the writer thread -----------------------------------------------------------------------
    def _hand_over(self, pending: _Pending) -> None:
        """Queue ``pending`` and make sure a writer runs in this process (a forked worker starts
        its own; an idle writer exits). Both sides decide under one lock, so an item is never
        queued just as the writer leaves."""
        with self._lock:
            if self._pid != os.getpid():
                self._queue, self._writer, self._pid = queue.SimpleQueue(), None, os.getpid()
            self._queue.put(pending)
            if self._writer is None:
                self._writer = threading.Thread(target=self._run, name="callback-intake", daemon=True)
                self._writer.start()

    def _next_batch(self) -> list[_Pending] | None:
        """What is waiting (at least one item), or None when the writer should exit."""
        try:
            batch = [self._queue.get(timeout=self.idle_s)]
        except queue.Empty:
            with self._lock:
                if self._queue.empty():
                    self._writer = None
                    return None
            batch = [self._queue.get()]
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            batch = [pending for pending in batch if not pending.abandoned]
            if not batch:
                continue
            try:
                self._write(batch)
            except BaseException as exc:  # never leave a caller waiting for a dead thread
                for pending in batch:
                    if not pending.done.is_set():
                        pending.error = exc
                        pending.done.set()
                if not isinstance(exc, Exception):
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

    def _commit(self, batch: list[_Pending]) -> list[Accepted]:
        services = self.services
        with services.db.transaction() as session:
            results = accept_many(session, services.cipher, services.blind_index,
                                  [pending.arrival for pending in batch])
            services.audit.append_many(session, [
                received_event(services, pending, accepted)
                for pending, accepted in zip(batch, results, strict=True) if accepted.created])
        return results


def received_event(services, pending: _Pending, accepted: Accepted) -> Event:
    message = pending.arrival.message
    return Event(
        EventType.MESSAGE_RECEIVED, actor=user_hash(services.blind_index, message.from_user),
        outcome="accepted", request_id=pending.arrival.request_id, fingerprint=pending.fingerprint,
        payload={"message_id": accepted.id, "msg_type": message.msg_type,
                 "event": getattr(message, "event", None), "agent_id": getattr(message, "agent_id", None)})
