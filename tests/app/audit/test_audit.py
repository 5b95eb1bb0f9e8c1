"""The audit chain on both databases: concurrent appends, every kind of tampering, purge."""

from __future__ import annotations

import multiprocessing
import secrets
from datetime import timedelta

import pytest
from sqlalchemy import text

from app.audit.chain import AuditLog, EventType, request_fingerprint
from app.db import Database, utcnow
from app.models import AuditChain, AuditEvent
from app.services import Services
from tests.support.env import settings_from


def append_many(db, audit: AuditLog, n: int, actor: str = "tester") -> None:
    for i in range(n):
        audit.record(db, EventType.REPLY_SENT, actor=actor, payload={"i": i})


def verify(services):
    with services.db.session() as session:
        return services.audit.verify(session)


def kinds(report):
    return sorted((issue.kind, issue.seq) for issue in report.issues)


def test_append_then_verify_and_payload_reads_back(services):
    append_many(services.db, services.audit, 5)
    report = verify(services)
    assert report.ok and report.rows == 5 and (report.first_seq, report.last_seq) == (1, 5)
    with services.db.session() as session:
        row = session.get(AuditEvent, 3)
        assert services.audit.payload_of(row) == {"i": 2}
        assert row.payload_enc.startswith("v1:") and '"i"' not in row.payload_enc
        assert row.prev_hash == session.get(AuditEvent, 2).row_hash


def _child(env: dict, n: int, worker: int) -> None:
    services = Services(settings_from(env), Database(env["DATABASE_URL"]))
    append_many(services.db, services.audit, n, actor=f"proc{worker}")
    services.db.dispose()


def test_concurrent_processes_keep_one_chain(env, services):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_child, args=(env, 50, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    report = verify(services)
    assert report.ok, report.issues
    assert report.rows == 200
    with services.db.session() as session:
        head = session.get(AuditChain, 1)
        assert head.last_seq == 200


def _tamper(db, sql: str, **params) -> None:
    with db.engine.begin() as conn:
        conn.execute(text(sql), params)


@pytest.fixture
def chain(services):
    append_many(services.db, services.audit, 30)
    assert verify(services).ok
    return services


def test_changed_row_is_named(chain):
    _tamper(chain.db, "UPDATE audit_events SET outcome = 'forged' WHERE seq = 7")
    assert kinds(verify(chain)) == [("changed", 7)]


def test_changed_payload_is_named(chain):
    with chain.db.session() as session:
        other = session.get(AuditEvent, 9).payload_enc
    _tamper(chain.db, "UPDATE audit_events SET payload_enc = :p WHERE seq = 8", p=other)
    assert kinds(verify(chain)) == [("changed", 8)]


def test_deleted_rows_are_named(chain):
    _tamper(chain.db, "DELETE FROM audit_events WHERE seq IN (12, 13)")
    report = verify(chain)
    assert kinds(report) == [("deleted", 12)]
    assert "12..13" in str(report.issues[0])


def test_deleted_last_row_is_named(chain):
    _tamper(chain.db, "DELETE FROM audit_events WHERE seq = 30")
    assert kinds(verify(chain)) == [("deleted", 30)]


def test_reordered_rows_are_named(chain):
    # Swap rows 10 and 11 (through a free seq, as an attacker would).
    _tamper(chain.db, "UPDATE audit_events SET seq = 1000 WHERE seq = 10")
    _tamper(chain.db, "UPDATE audit_events SET seq = 10 WHERE seq = 11")
    _tamper(chain.db, "UPDATE audit_events SET seq = 11 WHERE seq = 1000")
    report = verify(chain)
    assert kinds(report) == [("reordered", 10), ("reordered", 11)]
    assert "written as seq 11" in str(report.issues[0])


def _forged_values(chain, seq: int) -> dict:
    with chain.db.session() as session:
        prev = session.get(AuditEvent, seq - 1)
    return {"seq": seq, "t": utcnow(), "p": chain.cipher.encrypt("{}", "audit_events", "payload_enc", seq),
            "prev": prev.row_hash, "h": "f" * 64}


INSERT = ("INSERT INTO audit_events (seq, created_at, event_type, actor, outcome, payload_enc, "
          "prev_hash, row_hash) VALUES (:seq, :t, 'admin_login', 'mallory', 'ok', :p, :prev, :h)")


def test_inserted_row_at_the_end_is_named(chain):
    values = _forged_values(chain, 31)
    if chain.db.engine.dialect.name == "sqlite":
        values["t"] = values["t"].replace(tzinfo=None)
    _tamper(chain.db, INSERT, **values)
    assert kinds(verify(chain)) == [("inserted", 31)]


def test_inserted_row_in_the_middle_is_named(chain):
    # Make room at 15 by renumbering the rest (highest first, the PK stays unique).
    for seq in range(30, 14, -1):
        _tamper(chain.db, "UPDATE audit_events SET seq = :n WHERE seq = :o", n=seq + 1, o=seq)
    values = _forged_values(chain, 15)
    if chain.db.engine.dialect.name == "sqlite":
        values["t"] = values["t"].replace(tzinfo=None)
    _tamper(chain.db, INSERT, **values)
    report = verify(chain)
    assert ("inserted", 15) in kinds(report)
    moved = [i for i in report.issues if i.kind == "reordered"]
    assert len(moved) == 1 and moved[0].seq == 16 and "15..30" in moved[0].detail


def test_a_head_that_names_another_row_is_named(chain):
    """The chain's two ends are checked against the head row: the last row's hash...

    The head's MAC catches a head changed without the key; resealing it here (as a bug, or a
    holder of the key, could) leaves the end check alone to see that it names another row."""
    _tamper(chain.db, "UPDATE audit_chain SET last_hash = :h WHERE id = 1", h="e" * 64)
    assert kinds(verify(chain)) == [("head", 30), ("head", 30)]
    reseal_head(chain)
    report = verify(chain)
    assert kinds(report) == [("head", 30)] and "names another row" in str(report.issues[0])


def test_a_first_row_that_does_not_link_to_the_anchor_is_named(chain):
    """...and the first row's link to the purge anchor (the genesis hash before any purge)."""
    _tamper(chain.db, "UPDATE audit_chain SET anchor_hash = :h WHERE id = 1", h="e" * 64)
    reseal_head(chain)
    assert kinds(verify(chain)) == [("anchor", 1), ("purge", 0)]


def test_a_chain_from_before_migration_0007_is_sealed_by_its_next_append(chain):
    """Upgraded rows carry no head MAC: verify says so until the next append seals the head,
    which first writes the chain-key rotation event naming the key in use from then on."""
    _tamper(chain.db, "UPDATE audit_chain SET key_id = NULL, head_mac = NULL WHERE id = 1")
    report = verify(chain)
    assert kinds(report) == [("head", 30)] and "not sealed" in str(report.issues[0])
    append_many(chain.db, chain.audit, 1)
    report = verify(chain)
    assert report.ok and report.rows == 32, report.issues
    with chain.db.session() as session:
        event = session.get(AuditEvent, 31)
        assert chain.audit.payload_of(event) == {"chain_key": chain.audit.keys.current_id,
                                                 "previous_chain_key": None}


def test_a_head_copy_that_cannot_be_written_does_not_fail_the_event(env, db, tmp_path, caplog):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    services = Services(settings_from(env, audit_head_file=str(blocked / "head.json")), db)
    services.audit.record(db, EventType.ADMIN_CHANGE, actor="cli", payload={})
    assert "audit head copy not written" in caplog.text
    assert [i.kind for i in verify(services).issues] == ["external"]


def test_verify_cli_names_the_row_and_fails(chain):
    from app.web.factory import create_app

    _tamper(chain.db, "UPDATE audit_events SET actor = 'someone else' WHERE seq = 4")
    app = create_app(services=chain)
    result = app.test_cli_runner().invoke(args=["audit", "verify"])
    assert result.exit_code == 1
    assert "seq 4: changed" in result.output


def test_purge_keeps_the_chain_verifiable(chain):
    old = utcnow() - timedelta(days=200)
    _tamper(chain.db, "UPDATE audit_events SET created_at = :t WHERE seq <= 10",
            t=old.replace(tzinfo=None) if chain.db.engine.dialect.name == "sqlite" else old)
    # Moving the time is itself tampering; re-seal those rows as if written then.
    _reseal_all(chain)
    assert verify(chain).ok
    assert chain.audit.purge(chain.db, 180) == 10
    report = verify(chain)
    assert report.ok, report.issues
    # the 20 kept and the purge's own sealed event, which names the new anchor
    assert (report.anchor_seq, report.first_seq, report.rows) == (10, 11, 21)
    with chain.db.session() as session:
        event = session.get(AuditEvent, 31)
        assert event.event_type == "audit_purge"
        assert chain.audit.payload_of(event)["through_seq"] == 10
    append_many(chain.db, chain.audit, 3)
    assert verify(chain).ok
    # Deleting the first row after the anchor is still found.
    _tamper(chain.db, "DELETE FROM audit_events WHERE seq = 11")
    assert kinds(verify(chain)) == [("deleted", 11)]


def test_purge_refuses_short_retention_and_broken_chain(chain):
    with pytest.raises(ValueError):
        chain.audit.purge(chain.db, 90)
    from app.web.factory import create_app

    result = create_app(services=chain).test_cli_runner().invoke(args=["audit", "purge", "--days", "30"])
    assert result.exit_code != 0 and "at least 180" in result.output


def _reseal_all(services) -> None:
    with services.db.transaction() as session:
        prev = "0" * 64
        for row in session.query(AuditEvent).order_by(AuditEvent.seq):
            row.prev_hash = prev
            row.row_hash = services.audit.seal(row)
            prev = row.row_hash
        session.get(AuditChain, 1).last_hash = prev
    reseal_head(services)
    services.audit.publish_head(services.db, resealed=True)  # a key holder's rewrite


def reseal_head(services, key: bytes | None = None) -> None:
    """Give the head a MAC that holds for what it now says (under ``key``, else the current)."""
    import hashlib
    import hmac

    from app.audit.head import Head
    from app.audit.keys import key_id

    key = key or services.audit.keys.current
    with services.db.transaction() as session:
        head = session.get(AuditChain, 1)
        head.key_id = key_id(key)
        head.head_mac = hmac.new(key, Head.of(head).canonical(), hashlib.sha256).hexdigest()


def test_fingerprint_is_keyed_and_hourly():
    at = utcnow().replace(minute=5)
    a = request_fingerprint("k" * 32, "10.0.0.1", "Mozilla", at)
    assert a == request_fingerprint("k" * 32, "10.0.0.1", "Mozilla", at.replace(minute=55))
    assert a != request_fingerprint("x" * 32, "10.0.0.1", "Mozilla", at)
    assert a != request_fingerprint("k" * 32, "10.0.0.1", "Mozilla", at + timedelta(hours=1))
    assert len(a) == 64


def test_beat_task_purges_and_releases_stale_reservations(chain, monkeypatch):
    import worker.tasks as tasks
    from app.accounting import set_budget
    from worker import runtime
    from worker.conversation import ConversationStore
    from worker.processor import MessageProcessor

    old = utcnow() - timedelta(days=181)
    _tamper(chain.db, "UPDATE audit_events SET created_at = :t WHERE seq <= 5",
            t=old.replace(tzinfo=None) if chain.db.engine.dialect.name == "sqlite" else old)
    _reseal_all(chain)
    processor = MessageProcessor(chain, None, None, ConversationStore(chain.redis, chain.cipher, 60, 5))
    monkeypatch.setattr(runtime, "processor", lambda: processor)
    with chain.db.transaction() as session:
        set_budget(session, "global", "", "day", "1")
    processor.meter.accounting.reserve("u", "", "glm-4", 10, 10,
                                       now=utcnow() - timedelta(hours=2))
    assert tasks.data_maintenance() == {"purged": 5, "charged": 1, "alerts_resent": 0}
    report = verify(chain)
    assert report.ok and report.anchor_seq == 5 and report.rows == 26  # 25 + the purge's event


def test_secret_key_rotation_keeps_the_chain_verifiable_and_rotate_reseals_it(env, db):
    from app.security.rotation import rotate_keys

    old_secret, new_secret = env["SECRET_KEY"], secrets.token_urlsafe(48)
    before = Services(settings_from(env), db)
    append_many(db, before.audit, 4)

    alone = Services(settings_from({**env, "SECRET_KEY": new_secret}), db)
    assert kinds(verify(alone)) == [("changed", 1), ("changed", 2), ("changed", 3), ("changed", 4),
                                    ("head", 4)]

    rotated = Services(settings_from({**env, "SECRET_KEY": new_secret,
                                      "SECRET_KEY_PREVIOUS": old_secret}), db)
    # The first append under the new key seals the chain-key key_rotation event (seq 5) first;
    # the new rows follow under the new key, linked to the old ones.
    append_many(db, rotated.audit, 2)
    assert verify(rotated).ok and verify(rotated).rows == 7
    with db.session() as session:
        event = session.get(AuditEvent, 5)
        assert event.event_type == "key_rotation"
        assert rotated.audit.payload_of(event)["chain_key"] == rotated.audit.keys.current_id

    rotate_keys(rotated)  # re-seals every row (and appends the key_rotation event) under the new key
    assert verify(alone).ok and verify(alone).rows == 8
    assert not verify(before).ok  # the old key alone no longer fits


def test_keys_rotate_right_after_a_secret_key_change_still_retires_the_old_key(env, db):
    """No append between the SECRET_KEY change and ``keys rotate``: the re-sealed chain still
    gets its chain-key rotation event, so the old key (if kept) is good for no later row."""
    from app.security.rotation import rotate_keys

    old_secret = env["SECRET_KEY"]
    append_many(db, Services(settings_from(env), db).audit, 3)
    rotated = Services(settings_from({**env, "SECRET_KEY": secrets.token_urlsafe(48),
                                      "SECRET_KEY_PREVIOUS": old_secret}), db)
    rotate_keys(rotated)
    report = verify(rotated)
    assert report.ok and report.rows == 5, report.issues
    with db.session() as session:
        rotation, data_keys = session.get(AuditEvent, 4), session.get(AuditEvent, 5)
        assert rotated.audit.payload_of(rotation)["chain_key"] == rotated.audit.keys.current_id
        assert data_keys.event_type == "key_rotation" and "rewritten" in rotated.audit.payload_of(data_keys)
