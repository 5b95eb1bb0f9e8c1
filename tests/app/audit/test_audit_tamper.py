"""An insider with write access to the database (not the server's keys) against `audit verify`.

Each test does what such an insider could, on SQLite and on PostgreSQL, and checks that
`audit verify` (the CLI, exit 1) names it: a cut tail with the head moved, everything deleted and
the head reset, an edited or inserted event, a purge without its sealed event, a retired key used
after its rotation, and the head's copy outside the database disagreeing.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import select, text

from app.audit.chain import GENESIS, EventType
from app.audit.keys import chain_key
from app.db import utcnow
from app.models import AuditChain, AuditEvent
from app.services import Services
from app.web.factory import create_app
from tests.app.audit.test_audit import (
    INSERT,
    _forged_values,
    _reseal_all,
    append_many,
    kinds,
    reseal_head,
)
from tests.support.env import settings_from

HEAD_COLUMNS = ("last_seq", "last_hash", "anchor_seq", "anchor_hash", "key_id", "head_mac", "updated_at")


def sql(services, statement: str, **params) -> None:
    with services.db.engine.begin() as conn:
        conn.execute(text(statement), params)


def verify(services, **kwargs):
    with services.db.session() as session:
        return services.audit.verify(session, **kwargs)


def cli_verify(services):
    return create_app(services=services).test_cli_runner().invoke(args=["audit", "verify"])


def head_row(services) -> dict:
    with services.db.engine.connect() as conn:
        return dict(conn.execute(text(f"SELECT {', '.join(HEAD_COLUMNS)} FROM audit_chain WHERE id = 1"))
                    .mappings().one())


def put_head(services, values: dict) -> None:
    sql(services, "UPDATE audit_chain SET " + ", ".join(f"{c} = :{c}" for c in values) + " WHERE id = 1",
        **values)


def row_hash(services, seq: int) -> str:
    with services.db.session() as session:
        return session.scalar(select(AuditEvent.row_hash).where(AuditEvent.seq == seq))


@pytest.fixture
def guarded(env, db, redis_client, tmp_path):
    """30 events under services with checkpoints every 60 min and a head copy in a file."""
    services = Services(settings_from(env, audit_checkpoint_minutes=60,
                                      audit_head_file=str(tmp_path / "audit-head.json")), db)
    append_many(services.db, services.audit, 30)
    result = cli_verify(services)
    assert result.exit_code == 0 and "audit chain ok: 30 events" in result.output, result.output
    return services


def broken(services) -> list[tuple[str, int]]:
    """What `audit verify` says is wrong (it must exit 1), as (kind, seq)."""
    result = cli_verify(services)
    assert result.exit_code == 1 and "audit chain BROKEN" in result.output, result.output
    return kinds(verify(services))


def test_a_cut_tail_with_the_head_moved_to_the_new_end(guarded):
    sql(guarded, "DELETE FROM audit_events WHERE seq > 25")
    put_head(guarded, {"last_seq": 25, "last_hash": row_hash(guarded, 25)})
    found = broken(guarded)
    assert ("head", 25) in found  # its MAC no longer fits
    assert ("external", 30) in found  # the copy outside the database still names seq 30


def test_a_cut_tail_under_an_old_head_put_back_shows_as_stale_and_in_the_copy(guarded):
    """The head's MAC cannot tell a *replayed* head: an old head row, MAC and all, restored
    over a cut tail. The checkpoints' freshness and the outside copy can."""
    old_head = head_row(guarded)
    append_many(guarded.db, guarded.audit, 5)
    sql(guarded, "DELETE FROM audit_events WHERE seq > 30")
    put_head(guarded, old_head)
    assert kinds(verify(guarded)) == [("external", 35)]
    later = verify(guarded, now=utcnow() + timedelta(hours=3))  # checkpoints would have resealed it
    assert ("stale", 30) in kinds(later)
    assert "last sealed 3 h" in str(next(i for i in later.issues if i.kind == "stale"))


def past(services, rows: int, ending: timedelta = timedelta(0)) -> None:
    """An honest history (written with the key, as the server would have): ``rows`` events 30
    minutes apart up to ``ending`` ago, every other one a checkpoint (every 60 minutes)."""
    for i in range(1, rows + 1):
        if i % 2:
            services.audit.record(services.db, EventType.REPLY_SENT, actor="user", payload={"i": i})
        else:
            services.audit.checkpoint(services.db)
    now = utcnow()
    with services.db.transaction() as session:
        for row in session.query(AuditEvent):
            row.created_at = now - ending - timedelta(minutes=30) * (rows - row.seq)
    _reseal_all(services)


def head_as_of(services, seq: int) -> dict:
    """The head as it was when ``seq`` was the last row: what an insider who kept a copy of
    the head row then could put back (MAC and all)."""
    import hashlib
    import hmac

    from app.audit.head import Head

    with services.db.session() as session:
        row = session.get(AuditEvent, seq)
        head = Head(seq, row.row_hash, 0, GENESIS, services.audit.keys.current_id, row.created_at)
    mac = hmac.new(services.audit.keys.current, head.canonical(), hashlib.sha256).hexdigest()
    return {"last_seq": seq, "last_hash": head.last_hash, "anchor_seq": 0, "anchor_hash": GENESIS,
            "key_id": head.key_id, "head_mac": mac, "updated_at": head.sealed_at}


def test_a_cut_tail_under_a_replayed_head_stays_a_gap_after_new_appends(services):
    """The head's staleness shows a replayed head only until the next append reseals it; the
    checkpoints' times in the chain keep the cut visible as a gap."""
    past(services, 30)
    assert verify(services).ok
    replayed = head_as_of(services, 20)  # 5 hours ago
    sql(services, "DELETE FROM audit_events WHERE seq > 20")
    put_head(services, replayed)
    assert broken(services) == [("stale", 20)]
    services.audit.record(services.db, EventType.REPLY_SENT, actor="user", payload={})
    found = broken(services)
    assert found == [("gap", 21)]
    assert "5 h 00 min without any event since seq 20" in cli_verify(services).output


@pytest.mark.parametrize("outage", [None, "power cut in the server room, 5 h"])
def test_a_real_outage_is_a_gap_until_signed_off(services, outage):
    past(services, 10, ending=timedelta(hours=5))
    assert kinds(verify(services)) == []  # its head was sealed just now (the history's rewrite)
    args = ["audit", "checkpoint", *(["--outage", outage] if outage else [])]
    result = create_app(services=services).test_cli_runner().invoke(args=args)
    assert result.exit_code == 0, result.output
    if outage:
        assert verify(services).ok
        with services.db.session() as session:
            assert services.audit.payload_of(session.get(AuditEvent, 11))["outage"] == outage
    else:
        assert broken(services) == [("gap", 11)]


def test_every_event_deleted_and_the_head_reset(guarded):
    sql(guarded, "DELETE FROM audit_events")
    put_head(guarded, {"last_seq": 0, "last_hash": GENESIS, "anchor_seq": 0, "anchor_hash": GENESIS,
                       "key_id": None, "head_mac": None})
    found = broken(guarded)
    assert ("head", 0) in found and ("external", 30) in found
    assert "not sealed" in cli_verify(guarded).output


def test_every_event_deleted_and_the_head_anchored_past_them(guarded):
    """The other reset: the head says a purge took everything."""
    put_head(guarded, {"anchor_seq": 30, "anchor_hash": row_hash(guarded, 30)})
    sql(guarded, "DELETE FROM audit_events")
    found = broken(guarded)
    assert ("head", 30) in found and ("purge", 30) in found


def test_the_head_row_deleted(guarded):
    sql(guarded, "DELETE FROM audit_chain")
    assert broken(guarded) == [("head", 0)]
    with pytest.raises(ValueError):  # and nothing appends without it
        append_many(guarded.db, guarded.audit, 1)


def test_one_event_edited(guarded):
    sql(guarded, "UPDATE audit_events SET actor = 'someone else' WHERE seq = 12")
    assert broken(guarded) == [("changed", 12)]


def test_one_event_inserted(guarded):
    values = _forged_values(guarded, 31)
    if guarded.db.engine.dialect.name == "sqlite":
        values["t"] = values["t"].replace(tzinfo=None)
    sql(guarded, INSERT, **values)
    assert broken(guarded) == [("inserted", 31)]


def test_a_purge_without_its_sealed_event(guarded):
    anchor_hash = row_hash(guarded, 10)
    sql(guarded, "DELETE FROM audit_events WHERE seq <= 10")
    put_head(guarded, {"anchor_seq": 10, "anchor_hash": anchor_hash})
    found = broken(guarded)
    assert ("head", 30) in found and ("purge", 10) in found


def test_a_purge_without_its_event_shows_even_under_a_head_with_a_good_mac(chain_with_key_holder):
    """Were the head's MAC ever remade (a bug, a key holder), the missing purge event still shows."""
    services = chain_with_key_holder
    anchor_hash = row_hash(services, 10)
    sql(services, "DELETE FROM audit_events WHERE seq <= 10")
    put_head(services, {"anchor_seq": 10, "anchor_hash": anchor_hash})
    reseal_head(services)
    assert broken(services) == [("purge", 10)]


@pytest.fixture
def chain_with_key_holder(services):
    append_many(services.db, services.audit, 30)
    return services


def test_an_old_key_used_after_its_rotation(env, db, redis_client):
    old_secret = env["SECRET_KEY"]
    before = Services(settings_from(env), db)
    append_many(db, before.audit, 4)
    new_env = {**env, "SECRET_KEY": "n" + old_secret[1:][::-1], "SECRET_KEY_PREVIOUS": old_secret}
    after = Services(settings_from(new_env), db)
    append_many(db, after.audit, 3)  # seq 5: the chain-key rotation event; 6..8 under the new key
    assert verify(after).ok
    # The old key leaked: rows 7 and 8 rewritten and re-sealed (and re-linked) under it, and
    # the head re-sealed under it too. Each MAC holds, under a key retired at seq 5.
    old_key = chain_key(old_secret)
    with db.transaction() as session:
        prev = session.get(AuditEvent, 6).row_hash
        for seq in (7, 8):
            row = session.get(AuditEvent, seq)
            row.outcome = "denied" if seq == 7 else row.outcome
            row.prev_hash = prev
            row.row_hash = prev = before.audit.seal(row, key=old_key)
        session.get(AuditChain, 1).last_hash = prev
    reseal_head(after, key=old_key)
    found = broken(after)
    assert ("key", 7) in found and ("key", 8) in found
    assert found == [("key", 7), ("key", 8), ("key", 8)]  # rows 7, 8 and the head


def test_an_old_key_rewriting_a_row_from_before_its_rotation(env, db, redis_client):
    """Before its rotation the old key is still good, so a row re-sealed under it holds on its
    own; its successor's link to it does not."""
    old_secret = env["SECRET_KEY"]
    before = Services(settings_from(env), db)
    append_many(db, before.audit, 4)
    after = Services(settings_from({**env, "SECRET_KEY": "n" + old_secret[1:][::-1],
                                    "SECRET_KEY_PREVIOUS": old_secret}), db)
    append_many(db, after.audit, 2)
    with db.transaction() as session:
        row = session.get(AuditEvent, 3)
        row.actor = "someone else"
        row.row_hash = before.audit.seal(row, key=chain_key(old_secret))
    assert broken(after) == [("link", 4)]


def test_the_copy_outside_the_database_disagreeing(guarded, tmp_path):
    import json

    path = tmp_path / "audit-head.json"
    copy = json.loads(path.read_text())
    assert copy["last_seq"] == 30 and copy["last_hash"] == row_hash(guarded, 30)
    path.write_text(json.dumps({**copy, "last_hash": "a" * 64}))
    assert broken(guarded) == [("external", 30)]
    path.unlink()
    assert broken(guarded) == [("external", 30)]


def test_untouched_chain_with_purge_checkpoint_and_rotation_verifies(guarded, env, tmp_path):
    """The honest path on both databases: a checkpoint, a purge and a SECRET_KEY rotation are
    each a sealed event, and the chain, its head and its copy all agree afterwards."""
    old = utcnow() - timedelta(days=200)
    sql(guarded, "UPDATE audit_events SET created_at = :t WHERE seq <= 10",
        t=old.replace(tzinfo=None) if guarded.db.engine.dialect.name == "sqlite" else old)
    _reseal_all(guarded)
    assert guarded.audit.checkpoint(guarded.db) == 31
    assert guarded.audit.purge(guarded.db, 180) == 10
    rotated = Services(settings_from({**env, "SECRET_KEY": "r" + env["SECRET_KEY"][1:][::-1],
                                      "SECRET_KEY_PREVIOUS": env["SECRET_KEY"]},
                                     audit_checkpoint_minutes=60,
                                     audit_head_file=str(tmp_path / "audit-head.json")), guarded.db)
    rotated.audit.record(rotated.db, EventType.ADMIN_CHANGE, actor="cli", payload={})
    report = verify(rotated)
    assert report.ok, report.issues
    with rotated.db.session() as session:
        types = [e.event_type for e in session.scalars(select(AuditEvent).order_by(AuditEvent.seq))]
    assert types[-4:] == ["audit_checkpoint", "audit_purge", "key_rotation", "admin_change"]
    assert verify(rotated, now=utcnow() + timedelta(minutes=100)).ok  # within twice the interval


def test_purge_verifies_outside_the_chain_lock(chain_with_key_holder):
    """While the purge walks the chain, an append must go through (it used to wait for the
    whole verification: every callback answered 503 once rows passed the retention)."""
    services = chain_with_key_holder
    old = utcnow() - timedelta(days=200)
    sql(services, "UPDATE audit_events SET created_at = :t WHERE seq <= 10",
        t=old.replace(tzinfo=None) if services.db.engine.dialect.name == "sqlite" else old)
    _reseal_all(services)
    real_verify = services.audit.verify
    appended = threading.Event()
    done_while_verifying: list[bool] = []

    def verify_while_someone_appends(session, **kwargs):
        writer = threading.Thread(target=lambda: (services.audit.record(
            services.db, EventType.REPLY_SENT, actor="during-purge", payload={}), appended.set()))
        writer.start()
        writer.join(10)
        done_while_verifying.append(appended.is_set())
        return real_verify(session, **kwargs)

    services.audit.verify = verify_while_someone_appends
    try:
        assert services.audit.purge(services.db, 180) == 10
    finally:
        del services.audit.verify
    assert done_while_verifying == [True], "an append waited for the purge's verification"
    report = verify(services)
    assert report.ok, report.issues
    with services.db.session() as session:
        rows = list(session.scalars(select(AuditEvent).where(AuditEvent.seq > 30).order_by(AuditEvent.seq)))
    assert [(r.seq, r.event_type, r.actor) for r in rows] == [
        (31, "reply_sent", "during-purge"), (32, "audit_purge", "system")]


def test_a_row_changed_while_the_purge_verified_is_refused(chain_with_key_holder):
    """The lock is taken after verifying: the new anchor must still be the row verified."""
    from app.audit.chain import ChainBroken

    services = chain_with_key_holder
    old = utcnow() - timedelta(days=200)
    sql(services, "UPDATE audit_events SET created_at = :t WHERE seq <= 10",
        t=old.replace(tzinfo=None) if services.db.engine.dialect.name == "sqlite" else old)
    _reseal_all(services)
    real_verify = services.audit.verify

    def verify_then_tamper(session, **kwargs):
        report = real_verify(session, **kwargs)
        sql(services, "UPDATE audit_events SET row_hash = :h WHERE seq = 10", h="d" * 64)
        return report

    services.audit.verify = verify_then_tamper
    with pytest.raises(ChainBroken, match="changed while the purge verified"):
        services.audit.purge(services.db, 180)
    del services.audit.verify
    with services.db.session() as session:
        assert session.get(AuditChain, 1).anchor_seq == 0


# -- the head's copy outside the database keeps up with the callbacks ---------------------------
def _callback(services, n: int):
    from app.outbox.rows import Arrival
    from app.wecom.messages import parse_message
    from tests.support.callbacks import text_message_xml

    s = services.settings
    return Arrival(parse_message(text_message_xml(s.wecom_corp_id, s.wecom_agent_id, f"message {n}",
                                                  "zhangwei", 5000 + n)))


def copied_seq(path) -> int:
    import json

    return json.loads(path.read_text())["last_seq"]


def test_callbacks_cut_under_an_old_head_show_before_and_after_the_next_appends(guarded, tmp_path):
    """The issue's probe: the newest callbacks' events cut, the head row saved before them put
    back (MAC and all). The copy outside the database follows the callbacks' commits (it lagged
    them by up to a checkpoint interval), so verify names the cut at once; and the callbacks that
    come next, reusing the cut seqs, do not overwrite the copy that names the cut row."""
    from app.intake.local import LocalIntake
    from tests.support.stack import wait_for

    path = tmp_path / "audit-head.json"
    intake = LocalIntake(guarded)
    old_head = head_row(guarded)  # seq 30
    for n in range(1, 6):
        intake.accept(_callback(guarded, n))  # message_received, seqs 31..35
    wait_for(lambda: copied_seq(path) == 35, 10, what="the head copy to reach seq 35")
    cut_hash = row_hash(guarded, 35)
    sql(guarded, "DELETE FROM audit_events WHERE seq > 30")
    put_head(guarded, old_head)
    assert broken(guarded) == [("external", 35)]  # before any append: the copy is ahead
    for n in range(6, 14):
        intake.accept(_callback(guarded, n))  # seqs 31..38 again, past the copy's 35
    wait_for(lambda: head_row(guarded)["last_seq"] == 38, 10, what="the new appends")
    time.sleep(1.5)  # the copier's turn (at most every 0.5 s)
    assert copied_seq(path) == 35 and row_hash(guarded, 35) != cut_hash
    found = broken(guarded)
    assert found == [("external", 35)]
    assert "names another row at seq 35" in cli_verify(guarded).output


def test_an_honest_callback_stream_keeps_the_copy_moving_and_the_chain_verifying(guarded, tmp_path):
    from app.intake.local import LocalIntake
    from tests.support.stack import wait_for

    intake = LocalIntake(guarded)
    for n in range(1, 21):
        intake.accept(_callback(guarded, n))
    wait_for(lambda: copied_seq(tmp_path / "audit-head.json") == 50, 10, what="the copy at seq 50")
    assert verify(guarded).ok


def test_the_operator_sets_the_stale_limit(env, db, redis_client, tmp_path):
    """AUDIT_STALE_MINUTES: a head (or a copy behind the chain) older than it is reported."""
    from app.config import ConfigError

    services = Services(settings_from(env, audit_checkpoint_minutes=10, audit_stale_minutes=15,
                                      audit_head_file=str(tmp_path / "audit-head.json")), db)
    append_many(services.db, services.audit, 3)
    assert verify(services, now=utcnow() + timedelta(minutes=14)).ok
    found = verify(services, now=utcnow() + timedelta(minutes=20))
    assert kinds(found) == [("stale", 3)] and "stale limit of 15 min" in str(found.issues[0])
    with services.db.transaction() as session:  # appended without a copy (as an admin view does)
        services.audit.append(session, EventType.ADMIN_CHANGE, actor="admin:x", payload={})
    assert verify(services, now=utcnow() + timedelta(minutes=5)).ok  # a copy may lag a while
    late = verify(services, now=utcnow() + timedelta(minutes=20))
    assert ("external", 3) in kinds(late) and "copies stopped" in str(late.issues)
    with pytest.raises(ConfigError, match="AUDIT_STALE_MINUTES"):
        settings_from(env, audit_checkpoint_minutes=60, audit_stale_minutes=60)
