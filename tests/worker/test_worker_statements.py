"""The worker's cheaper statements keep their meaning, on SQLite and PostgreSQL: the finish that
reads the user's next queued message, the claim's "why not", and the one-statement sessions."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from app.models import InboundMessage, MessageStatus
from app.outbox import rows
from app.outbox.rows import ClaimResult
from app.outbox.statements import standalone
from app.web.factory import create_app
from tests.worker.test_processor_data import ids_of, post_message


def _messages(services, users: list[str]) -> list[int]:
    client = create_app(services=services).test_client()
    for k, user in enumerate(users):
        assert post_message(client, services, f"问题 {k}", 7000 + k, user=user).status_code == 200
    return ids_of(services)


def _status(services, message_id: int) -> str:
    with services.db.session() as session:
        return session.scalar(select(InboundMessage.status).where(InboundMessage.id == message_id))


def test_the_finish_returns_the_users_next_queued_message_and_only_with_the_lease(services):
    first, other_user, second, third = _messages(services, ["alice", "bob", "alice", "alice"])
    db = services.db
    with standalone(db) as sql:
        claimed = rows.claim(sql, first, "me", 60)
    assert claimed.result == ClaimResult.CLAIMED
    user_hash = claimed.row.user_hash
    with standalone(db) as sql:  # not the lease holder: nothing changes
        assert rows.finish_then_next(sql, first, "not-me", MessageStatus.ANSWERED, user_hash) == (False, None)
    assert _status(services, first) == MessageStatus.PROCESSING
    with standalone(db) as sql:
        # the second is alice's next queued message; bob's is someone else's
        assert rows.finish_then_next(sql, first, "me", MessageStatus.ANSWERED, user_hash) == (True, second)
    assert _status(services, first) == MessageStatus.ANSWERED  # committed: another session sees it
    with standalone(db) as sql:
        assert rows.claim(sql, second, "me", 60).result == ClaimResult.CLAIMED
    with standalone(db) as sql:  # the third is queued after the second
        assert rows.finish_then_next(sql, second, "me", MessageStatus.ANSWERED, user_hash) == (True, third)
    with standalone(db) as sql:
        assert rows.claim(sql, third, "me", 60).result == ClaimResult.CLAIMED
    with standalone(db) as sql:  # the last: nothing after it
        assert rows.finish_then_next(sql, third, "me", MessageStatus.ANSWERED, user_hash) == (True, None)
    assert _status(services, other_user) == MessageStatus.QUEUED


def test_a_claim_that_fails_says_why(services):
    first, second = _messages(services, ["carol", "carol"])
    with standalone(services.db) as sql:
        assert rows.claim(sql, first, "me", 60).result == ClaimResult.CLAIMED
    with standalone(services.db) as sql:
        behind = rows.claim(sql, second, "other", 60)
        assert (behind.result, behind.retry_after_s) == (ClaimResult.WAIT_EARLIER, 0.5)
        leased = rows.claim(sql, first, "other", 60)
        assert leased.result == ClaimResult.LEASED and 59 < leased.retry_after_s <= 60.2
        assert rows.claim(sql, 10**9, "other", 60).result == ClaimResult.MISSING
    with standalone(services.db) as sql:
        assert rows.finish(sql, first, "me", MessageStatus.ANSWERED)
    with standalone(services.db) as sql:
        assert rows.claim(sql, first, "other", 60).result == ClaimResult.DONE


def test_a_message_answered_in_a_drain_needs_no_claim_of_its_own_task(services, monkeypatch):
    """An employee's queued messages are answered in one drain; their own tasks then find them
    remembered and run no claim. Another process (which drained nothing) claims and finds them done."""
    from tests.worker.test_processor_data import FakeLLM, processor_for

    first, second, other_user, third = _messages(services, ["dora", "dora", "erin", "dora"])
    claims = []
    real_claim = rows.claim
    monkeypatch.setattr(rows, "claim", lambda session, message_id, *a: claims.append(message_id)
                        or real_claim(session, message_id, *a))
    llm = FakeLLM()
    processor = processor_for(services, llm)
    assert processor.process(first).status == "done"
    assert claims == [first, second, third] and llm.calls == 3  # the drain answered dora's three
    assert {_status(services, m) for m in (first, second, third)} == {MessageStatus.ANSWERED}
    claims.clear()
    assert processor.process(second).reason == processor.process(third).reason == "not-ours"
    assert claims == [] and llm.calls == 3  # no claim, no second answer
    assert processor.process(second).reason == "not-ours" and claims == [second]  # remembered once
    elsewhere = processor_for(services, llm)
    assert elsewhere.process(third).reason == "not-ours" and claims == [second, third]
    assert elsewhere.process(other_user).status == "done" and _status(services, other_user) == MessageStatus.ANSWERED


def test_the_claim_says_whether_a_budget_is_enabled_and_only_then_the_worker_reserves(services, monkeypatch):
    """Without an enabled budget the worker admits the call without the reservation's group
    commit, and the usage is still recorded; once one is enabled, the next message reserves
    (and is blocked by a budget it is over)."""
    from app.accounting import Accounting, set_budget, set_budget_enabled, set_price
    from app.models import UsageRecord
    from tests.worker.test_processor_data import FakeLLM, processor_for

    first, second, third = _messages(services, ["fay", "gus", "hal"])
    with services.db.transaction() as session:
        set_price(session, "glm-4", "5", "1", "15")
        disabled = set_budget(session, "user", "nobody", "day", "1")
        set_budget_enabled(session, disabled.id, False)
    reserves = []
    real_reserve = Accounting.reserve
    monkeypatch.setattr(Accounting, "reserve", lambda self, *a, **k: reserves.append(a)
                        or real_reserve(self, *a, **k))
    processor = processor_for(services, FakeLLM())
    assert processor.process(first).status == "done"
    assert reserves == [] and _status(services, first) == MessageStatus.ANSWERED
    with services.db.session() as session:
        assert session.scalar(select(UsageRecord.message_id).where(UsageRecord.message_id == first)) == first

    with services.db.transaction() as session:
        set_budget(session, "global", "", "day", "1000")
    with standalone(services.db) as sql:
        claimed = rows.claim(sql, second, "me", 60)
        assert claimed.row.budgeted
        assert rows.finish(sql, second, "me", MessageStatus.QUEUED)
    assert processor.process(second).status == "done"
    assert len(reserves) == 1 and _status(services, second) == MessageStatus.ANSWERED

    with services.db.transaction() as session:
        set_budget(session, "global", "", "day", "0.000001")  # spent already by the second
    assert processor.process(third).status == "done"
    assert len(reserves) == 2 and processor.llm.calls == 2
    assert "预算已用完" in processor.wecom.sent[-1][2]


def test_the_leased_updates_write_what_the_orm_reads_back(services):
    """The stored reply and the finish run as plain SQL on the driver's cursor: times, text,
    numbers and NULLs come back through the ORM as written, and only with the lease."""
    from datetime import timedelta

    from app.db import utcnow

    [message] = _messages(services, ["ivy"])
    with standalone(services.db) as sql:
        assert rows.claim(sql, message, "me", 60).result == ClaimResult.CLAIMED
    later = utcnow() + timedelta(minutes=3)
    with standalone(services.db) as sql:
        assert not rows.save_progress(sql, message, "not-me", reply_enc="x")
        assert rows.save_progress(sql, message, "me", reply_enc="密文", reply_kind="markdown",
                                  chunks_total=2, model="glm-4", prompt_tokens=None)
        assert rows.finish(sql, message, "me", MessageStatus.ANSWERED, answered_at=later,
                           chunks_sent=2)
    with services.db.session() as session:
        row = session.get(InboundMessage, message)
        assert (row.status, row.reply_enc, row.reply_kind, row.chunks_total, row.chunks_sent, row.model,
                row.prompt_tokens, row.lease_owner, row.lease_until) == (
            MessageStatus.ANSWERED, "密文", "markdown", 2, 2, "glm-4", None, None, None)
        assert row.answered_at == later and row.answered_at.tzinfo is not None
        assert abs(row.updated_at - utcnow()) < timedelta(minutes=1)
    with standalone(services.db) as sql, pytest.raises(ValueError, match="not columns"):
        rows.save_progress(sql, message, "me", **{"reply_enc = 'x', status": "queued"})


def test_the_claimed_row_is_the_row_as_the_orm_reads_it(services):
    """The claim runs as plain SQL on the driver's cursor: every column comes back as the ORM
    reads it (times aware and in UTC on both databases), with whether a budget is enabled."""
    from datetime import UTC

    [message] = _messages(services, ["jay"])
    with standalone(services.db) as sql:
        claimed = rows.claim(sql, message, "me", 60)
    assert claimed.result == ClaimResult.CLAIMED and claimed.row.budgeted is False
    with services.db.session() as session:
        row = session.get(InboundMessage, message)
        expected = {column.key: getattr(row, column.key) for column in InboundMessage.__table__.c}
    got = {c: getattr(claimed.row, c) for c in expected}
    assert got == expected
    assert (got["status"], got["lease_owner"], got["attempts"]) == (MessageStatus.PROCESSING, "me", 1)
    for name in ("created_at", "updated_at", "lease_until"):
        assert got[name].tzinfo == UTC


def test_standalone_statements_give_their_connection_back_transactional(services):
    """On PostgreSQL the worker's standalone statements run on a pooled connection in autocommit;
    it goes back to the pool as it came, so a later transaction that fails is still rolled
    back, whichever pooled connection it gets."""
    [message] = _messages(services, ["kim"])
    with standalone(services.db) as sql:
        assert rows.claim(sql, message, "me", 60).result == ClaimResult.CLAIMED
    for _ in range(3):
        with pytest.raises(RuntimeError), services.db.transaction() as session:
            session.execute(update(InboundMessage).where(InboundMessage.id == message)
                            .values(status=MessageStatus.FAILED))
            raise RuntimeError("rolled back")
        assert _status(services, message) == MessageStatus.PROCESSING
