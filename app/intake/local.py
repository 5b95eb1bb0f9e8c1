"""Group commit for the callbacks: messages that arrive together are written together.

Every accepted message is an outbox row and a ``message_received`` audit event, committed in
one transaction before WeCom hears 200. One transaction per message made the callbacks queue on
the database's single write lock (SQLite) or the audit chain's head row (PostgreSQL), each
holder paying its own BEGIN, statement round trips and commit. So messages are handed to one
writer, which takes everything that is waiting, writes it with one statement per kind, commits
and answers each. A lone message waits for nobody.

Where that writer runs:

- in the intake server (``app.web.intake_server``), one process for the whole web service, when
  gunicorn runs one (``gunicorn.conf.py``): the batches hold every web process's messages, and
  the transaction never waits for a GIL that request threads are holding;
- otherwise, and whenever the server cannot be reached, in a thread of this process (``LocalIntake``
  below), which is also what tests and ``flask run`` use.

The request thread prepares its message first (``app.outbox.rows.prepare``: the hashes and the payload's
JSON), so the writer does little besides the transaction. The new rows' tasks are published
after the commit, all that wait in one Redis round trip (``app.outbox.publisher``): the row is durable when WeCom hears
200, so the acknowledgement does not wait for Redis, and a broker that is down or slow leaves
the rows queued for the sweeper (the process dying between the commit and the publish does too)
instead of holding the callbacks.

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

from app.audit.chain import Event, EventType
from app.intake.batching import BatchThread
from app.intake.protocol import IntakeUnavailable
from app.metrics import counters as metrics
from app.outbox.publisher import publish_tasks
from app.outbox.rows import Accepted, Arrival, Prepared, accept_many, prepare

log = logging.getLogger(__name__)


def database_down(exc: BaseException) -> bool:
    """An error that any other message would meet too (the database is unreachable)."""
    return isinstance(exc, OperationalError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated)


class BatchWriter:
    """Writes prepared messages, a batch per transaction: outbox rows and their audit events."""

    def __init__(self, services):
        self.services = services

    def write(self, batch: list[Prepared]) -> list[Accepted | BaseException]:
        """What became of each message: its row, or the error that refused it."""
        try:
            results = self.commit(batch)
        except Exception as exc:
            if len(batch) > 1 and not database_down(exc):
                return [outcome for prepared in batch for outcome in self.write([prepared])]
            log.warning("outbox write failed for %d message(s): %s", len(batch), type(exc).__name__)
            return [exc] * len(batch)
        metrics.CALLBACK_BATCH.observe(len(batch))
        return results

    def commit(self, batch: list[Prepared]) -> list[Accepted]:
        services = self.services
        # A Core transaction: the ORM session's bookkeeping cost about 0.2 ms a batch here.
        with services.db.engine.begin() as connection:
            results = accept_many(connection, services.cipher, batch)
            services.audit.append_many(connection, [
                received_event(prepared, accepted)
                for prepared, accepted in zip(batch, results, strict=True) if accepted.created])
        services.audit.head_moved(services.db)  # the head's outside copy, soon, off this thread
        return results


def new_tasks(batch: list[Prepared], results: list) -> list[tuple[int, str | None]]:
    """(row id, request id) of every row this batch created whose task the intake publishes."""
    return [(accepted.id, prepared.request_id) for prepared, accepted in zip(batch, results, strict=True)
            if isinstance(accepted, Accepted) and accepted.created and prepared.enqueue]


def received_event(prepared: Prepared, accepted: Accepted) -> Event:
    return Event(
        EventType.MESSAGE_RECEIVED, actor=prepared.user_hash, outcome="accepted",
        request_id=prepared.request_id, fingerprint=prepared.fingerprint,
        payload={"message_id": accepted.id, "msg_type": prepared.msg_type, "event": prepared.event,
                 "agent_id": prepared.agent_id})


@dataclass(eq=False)
class _Pending:
    prepared: Prepared
    done: threading.Event = field(default_factory=threading.Event)
    result: Accepted | None = None
    error: BaseException | None = None
    abandoned: bool = False  # the caller stopped waiting (and answered 503): not worth writing


class LocalIntake:
    """The group commit in this process: one writer thread, one publisher thread."""

    def __init__(self, services, max_batch: int = 64, timeout_s: float = 3.0, idle_s: float = 30.0):
        self.services = services
        self.timeout_s = timeout_s
        self.writer = BatchWriter(services)
        self._writer = BatchThread("callback-intake", self._write_batch, max_batch, idle_s)
        self._publisher = BatchThread("callback-publish", self._publish, 256, idle_s)

    def accept(self, arrival: Arrival, fingerprint: str | None = None) -> Accepted:
        """Write ``arrival`` (and its audit event, when it is new) and return its row. A new
        row's task is published after the commit, unless ``arrival.enqueue`` is false."""
        return self.accept_prepared(prepare(self.services.blind_index, arrival, fingerprint))

    def accept_prepared(self, prepared: Prepared, timeout_s: float | None = None) -> Accepted:
        """``accept`` for a message prepared already; waits ``timeout_s`` (default: the intake's)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        pending = _Pending(prepared)
        self._writer.put(pending)
        if not pending.done.wait(timeout_s):
            pending.abandoned = True
            holder = self.services.db.writer_holder()
            waited = f" (SQLite writer turn held by {holder})" if holder else ""
            raise IntakeUnavailable(f"not written within {timeout_s:g} s{waited}")
        if pending.error is not None:
            raise IntakeUnavailable(f"not written: {type(pending.error).__name__}") from pending.error
        return pending.result

    def _write_batch(self, batch: list[_Pending]) -> None:
        batch = [pending for pending in batch if not pending.abandoned]
        if not batch:
            return
        try:
            results = self.writer.write([pending.prepared for pending in batch])
        except BaseException as exc:  # never leave a caller waiting for a dead thread
            results = [exc] * len(batch)
            raise
        finally:
            for pending, outcome in zip(batch, results, strict=True):
                if isinstance(outcome, Accepted):
                    pending.result = outcome
                else:
                    pending.error = outcome
                pending.done.set()
        for task in new_tasks([pending.prepared for pending in batch], results):
            self._publisher.put(task)

    def _publish(self, tasks: list[tuple[int, str | None]]) -> None:
        publish_tasks(self.services.publisher, tasks)
