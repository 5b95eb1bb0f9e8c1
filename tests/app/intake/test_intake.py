"""The callbacks' group commit (app/intake/local.py) on SQLite and PostgreSQL: messages that wait
together are written in one transaction, each exactly once, with its audit event, in order;
a bad message refuses only itself; a writer that cannot write makes callers give up in time."""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
import time

import pytest
import sqlalchemy as sa

from app.intake import local as intake_module
from app.intake.local import LocalIntake
from app.intake.protocol import IntakeUnavailable
from app.models import AuditEvent, InboundMessage
from app.outbox.rows import Arrival, Prepared, prepare
from app.wecom.messages import parse_message
from tests.support.callbacks import text_message_xml


def _message(services, n: int, user: str = "zhangwei"):
    s = services.settings
    return parse_message(text_message_xml(s.wecom_corp_id, s.wecom_agent_id, f"第{n}条 message {n}", user, 1000 + n))


def _batches(monkeypatch):
    """Every batch the writer wrote (its arrivals in order, with what each got), and the size
    of every batch it tried."""
    batches: list[list[tuple[Prepared, object]]] = []
    attempts: list[int] = []
    real = intake_module.accept_many

    def recording(session, cipher, arrivals):
        attempts.append(len(arrivals))
        results = real(session, cipher, arrivals)
        batches.append(list(zip(arrivals, results, strict=True)))
        return results

    monkeypatch.setattr(intake_module, "accept_many", recording)
    return batches, attempts


def _accept_all(intake: LocalIntake, arrivals: list[Arrival | Prepared]) -> list:
    results: list = [None] * len(arrivals)

    def one(i: int) -> None:
        try:
            if isinstance(arrivals[i], Prepared):
                results[i] = intake.accept_prepared(arrivals[i])
            else:
                results[i] = intake.accept(arrivals[i], fingerprint="f" * 64)
        except IntakeUnavailable as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(arrivals))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def _hold_writer(intake: LocalIntake) -> threading.Event:
    """Keep the writer busy on a first batch until the returned event is set."""
    release = threading.Event()
    real = intake.writer.commit

    def slow_once(batch):
        intake.writer.commit = real
        release.wait(10)
        return real(batch)

    intake.writer.commit = slow_once
    return release


def _accept_behind_a_busy_writer(intake: LocalIntake, services, arrivals: list[Arrival]) -> list:
    """Hand `arrivals` over (concurrently) while the writer is busy with a first message, so
    that they wait together; returns what each got."""
    release = _hold_writer(intake)
    first = threading.Thread(target=intake.accept, args=(Arrival(_message(services, 0)),))
    first.start()
    time.sleep(0.2)  # the writer now holds message 0; the next ones queue behind it
    results = []
    collector = threading.Thread(target=lambda: results.extend(_accept_all(intake, arrivals)))
    collector.start()
    time.sleep(0.5)
    release.set()
    collector.join(30)
    first.join(30)
    return results


def test_messages_that_wait_together_commit_together_each_once_in_order(services, monkeypatch):
    batches, _ = _batches(monkeypatch)
    arrivals = [Arrival(_message(services, n, user=f"user{n % 3}"), request_id=f"req{n}") for n in range(1, 13)]
    arrivals.append(dataclasses.replace(arrivals[4]))  # WeCom's retry of message 5, concurrently
    results = _accept_behind_a_busy_writer(LocalIntake(services), services, arrivals)

    sizes = [len(batch) for batch in batches]
    assert sizes[0] == 1 and max(sizes[1:]) > 1, sizes  # batched behind the first
    assert all(not isinstance(r, Exception) for r in results), results
    created = [r for r in results if r.created]
    assert len(created) == 12 and len({r.id for r in created}) == 12
    retry, original = results[-1], results[4]
    assert not retry.created and retry.id == original.id
    with services.db.session() as session:
        rows = session.execute(sa.select(InboundMessage.id, InboundMessage.request_id)
                               .order_by(InboundMessage.id)).all()
        assert len(rows) == 13
        assert services.audit.verify(session).ok
        received = session.scalars(sa.select(AuditEvent).where(AuditEvent.event_type == "message_received")).all()
    assert len(received) == 13
    assert {services.audit.payload_of(e)["message_id"] for e in received} == {r.id for r in rows}
    # Ids follow the order the messages were handed over (a user's are claimed in id order).
    for batch in batches:
        ids = [accepted.id for _, accepted in batch if accepted.created]
        assert ids == sorted(ids)
    for r in created:  # every row is sealed: its fields decrypt under its own id
        with services.db.session() as session:
            row = session.get(InboundMessage, r.id)
            assert services.cipher.decrypt(row.payload_enc, "inbound_messages", "payload_enc", r.id)


def test_a_bad_message_refuses_only_itself(services, monkeypatch):
    batches, attempts = _batches(monkeypatch)
    good = [Arrival(_message(services, n)) for n in range(1, 6)]
    # A time past any 64-bit integer: the database refuses it (the parser would, too).
    bad = dataclasses.replace(prepare(services.blind_index, Arrival(_message(services, 99))), create_time=10**30)
    results = _accept_behind_a_busy_writer(LocalIntake(services), services, [*good[:2], bad, *good[2:]])

    assert attempts[:2] == [1, 6]  # message 0, then all six together, which failed
    assert [len(b) for b in batches] == [1, 1, 1, 1, 1, 1]  # so each was written alone
    assert isinstance(results[2], IntakeUnavailable)
    assert [r.created for i, r in enumerate(results) if i != 2] == [True] * 5
    with services.db.session() as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(InboundMessage)) == 6
        assert services.audit.verify(session).ok


def test_a_writer_that_cannot_write_makes_the_caller_give_up(services):
    intake = LocalIntake(services, timeout_s=0.3)
    release = _hold_writer(intake)
    started = time.monotonic()
    with pytest.raises(IntakeUnavailable):
        intake.accept(Arrival(_message(services, 1)))
    assert time.monotonic() - started < 5
    release.set()  # the write goes through after all: WeCom's retry will be a duplicate
    retry = intake.accept(Arrival(_message(services, 1)))
    assert not retry.created


def _queued_tasks(services) -> list[tuple[list, str | None]]:
    """The (args, request id) of every task in the worker's queue, oldest first."""
    queue = services.celery.conf.task_default_queue
    tasks = []
    for raw in reversed(services.redis.lrange(queue, 0, -1)):  # kombu LPUSHes, the worker pops the tail
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        tasks.append((args, message["headers"].get("request_id")))
    return tasks


def test_each_new_row_is_published_once_after_its_commit_and_a_retry_is_not(services):
    services.redis.delete(services.celery.conf.task_default_queue)
    intake = LocalIntake(services)
    arrivals = [Arrival(_message(services, n), request_id=f"req{n}") for n in range(1, 6)]
    accepted = [r for r in _accept_all(intake, arrivals) if not isinstance(r, Exception)]
    assert len(accepted) == 5
    assert not intake.accept(Arrival(_message(services, 3), request_id="retry")).created
    deadline = time.monotonic() + 10
    while len(_queued_tasks(services)) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a wrongly published retry would have landed by now
    assert sorted(_queued_tasks(services)) == sorted(([r.id], f"req{n}") for n, r in
                                                   zip(range(1, 6), accepted, strict=True))


def test_an_arrival_that_enqueues_itself_is_not_published(services):
    services.redis.delete(services.celery.conf.task_default_queue)
    intake = LocalIntake(services)
    assert intake.accept(Arrival(_message(services, 1), enqueue=False)).created
    assert intake.accept(Arrival(_message(services, 2))).created
    deadline = time.monotonic() + 10
    while not _queued_tasks(services) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert len(_queued_tasks(services)) == 1


def test_a_broker_failure_keeps_the_rows_queued_for_the_sweeper(services, monkeypatch, caplog):
    def broker_down(name, tasks):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(services.publisher, "send_many", broker_down)
    intake = LocalIntake(services)
    with caplog.at_level("WARNING", logger="app.outbox.publisher"):
        assert intake.accept(Arrival(_message(services, 1))).created
        deadline = time.monotonic() + 10
        while "left for the sweeper" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "enqueue failed for 1 message(s), left for the sweeper" in caplog.text
    with services.db.session() as session:
        assert session.scalars(sa.select(InboundMessage.status)).all() == ["queued"]


def test_a_message_whose_caller_gave_up_is_not_written(services):
    intake = LocalIntake(services, timeout_s=0.3)
    release = _hold_writer(intake)  # busy with message 1 ...
    holder = threading.Thread(target=_accept_all, args=(intake, [Arrival(_message(services, 1))]))
    holder.start()
    time.sleep(0.1)
    with pytest.raises(IntakeUnavailable):  # ... so message 2 waits in vain: 503
        intake.accept(Arrival(_message(services, 2)))
    holder.join(10)
    intake.timeout_s = 10
    release.set()
    # WeCom's retry queues behind the abandoned copy, so the writer has passed that one by the
    # time the retry is answered: the retry is the first write of message 2.
    assert intake.accept(Arrival(_message(services, 2))).created
    with services.db.session() as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(InboundMessage)) == 2
