"""Audit events and spend to a syslog receiver (TLS, RFC 5425) and an OTLP collector, on SQLite
and PostgreSQL: everything arrives once, the sealed payload stays sealed unless the setting says
otherwise, and an outage in the middle (receiver down, events still coming, receiver back) ends
with the same counts on both sides and no event twice past the cursor."""

from __future__ import annotations

from collections import Counter

from app.accounting import Usage
from app.audit.chain import EventType
from app.services import Services
from app.siem import Exporter, build_sinks
from app.siem import cursors as siem_cursors
from tests.support.databases import REDIS_URL
from tests.support.env import make_env, settings_from
from tests.support.siem_receivers import OtlpCollector, SyslogReceiver


def siem_services(database_url, db, pki, syslog, otlp, **extra):
    values = dict(DATABASE_URL=database_url, REDIS_URL=REDIS_URL,
                  SIEM_SYSLOG_URL=syslog.url, SIEM_SYSLOG_CA_FILE=pki.ca,
                  SIEM_SYSLOG_CLIENT_CERT_FILE=pki.client_cert, SIEM_SYSLOG_CLIENT_KEY_FILE=pki.client_key,
                  SIEM_OTLP_URL=otlp.url, SIEM_OTLP_CA_FILE=pki.ca,
                  SIEM_OTLP_CLIENT_CERT_FILE=pki.client_cert, SIEM_OTLP_CLIENT_KEY_FILE=pki.client_key,
                  SIEM_OTLP_HEADERS="Authorization=Bearer collector-token-7Qm2xZ", SIEM_BATCH_SIZE="7")
    env = make_env(**(values | extra))
    return Services(settings_from(env), db)


def write_events(services, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        services.audit.record(services.db, EventType.MESSAGE_RECEIVED, actor=f"user-hash-{i % 3}",
                              payload={"message_id": i, "msg_type": "text", "secret_note": f"hush {i}"})


def write_usage(services, count: int) -> None:
    for i in range(count):
        services.accounting.settle(None, Usage(user_hash=f"user-hash-{i % 3}", department="3",
                                               model="glm-4", prompt_tokens=100 + i,
                                               completion_tokens=20, message_id=i))


def audit_seqs_at(syslog: SyslogReceiver) -> list[int]:
    return [int(m["sd"]["audit@32473"]["seq"]) for m in syslog.messages if m["msgid"] != "usage"]


def otlp_seqs(otlp: OtlpCollector) -> list[int]:
    return [r["attributes"]["audit.seq"] for r in otlp.records if r["scope"].endswith(".audit")]


def head_seq(services) -> int:
    from app.siem.records import audit_head

    with services.db.reader() as session:
        return audit_head(session)


def test_audit_and_spend_reach_both_receivers_once_with_the_payload_sealed(
        database_url, db, redis_client, pki, receivers):
    syslog, otlp = receivers
    services = siem_services(database_url, db, pki, syslog, otlp)
    write_events(services, 20)
    write_usage(services, 9)

    result = Exporter(services, build_sinks(services.settings)).run()

    assert not result.skipped
    head = head_seq(services)
    # every event once, in order, on both sinks (the sinks' own "export" events included)
    assert audit_seqs_at(syslog) == list(range(1, head + 1))  # in seq order
    assert sorted(otlp_seqs(otlp)) == list(range(1, head + 1))
    assert len(set(otlp_seqs(otlp))) == len(otlp_seqs(otlp))
    usage_ids = [int(m["sd"]["usage@32473"]["id"]) for m in syslog.messages if m["msgid"] == "usage"]
    assert sorted(usage_ids) == list(range(1, 10))
    assert sorted(r["attributes"]["usage.id"] for r in otlp.records if r["scope"].endswith(".usage")) \
        == list(range(1, 10))
    # batches of 7: bounded
    assert result.streams["syslog/audit"].batches == -(-head // 7)

    received = next(m for m in syslog.messages if m["msgid"] == "message_received")
    sd = received["sd"]["audit@32473"]
    assert received["pri"] == 13 * 8 + 5 and received["app"] == "wecom-bot"
    assert received["timestamp"].endswith("Z")
    assert sd["type"] == "message_received" and sd["actor"].startswith("user-hash-")
    assert sd["payload_sealed"].count(":") >= 1 and "hush" not in sd["payload_sealed"]
    assert "payload@32473" not in received["sd"]  # nothing decrypted by default
    assert all("hush" not in repr(m) for m in syslog.messages)
    assert all("hush" not in repr(r) for r in otlp.records)
    record = next(r for r in otlp.records if r["attributes"].get("audit.type") == "message_received")
    assert record["resource"]["service.name"] == "wecom-bot"
    assert record["severityNumber"] == 9 and record["body"].startswith("audit seq=")
    same = next(m for m in syslog.messages if m["sd"].get("audit@32473", {}).get("seq")
                == str(record["attributes"]["audit.seq"]))
    assert record["attributes"]["audit.row_hash"] == same["sd"]["audit@32473"]["row_hash"]
    assert all(h.get("Authorization") == "Bearer collector-token-7Qm2xZ" for h in otlp.headers_seen)
    spend = next(r for r in otlp.records if r["scope"].endswith(".usage"))
    assert spend["attributes"]["usage.model"] == "glm-4" and spend["attributes"]["usage.department"] == "3"
    assert float(spend["attributes"]["usage.cost"]) >= 0

    # the policy the audit stream left under is itself in the chain
    exports = [m for m in syslog.messages if m["msgid"] == "export"]
    assert len(exports) == 2  # one per sink: payload sealed

    # a second run: nothing new, nothing again
    again = Exporter(services, build_sinks(services.settings)).run()
    assert sum(r.sent for r in again.streams.values()) == 0
    assert len(syslog.messages) == head + 9 and len(otlp.records) == head + 9


def test_an_outage_in_the_middle_loses_nothing_and_repeats_nothing(
        database_url, db, redis_client, pki, receivers):
    syslog, otlp = receivers
    services = siem_services(database_url, db, pki, syslog, otlp)
    exporter = Exporter(services, build_sinks(services.settings))
    write_events(services, 15)
    write_usage(services, 4)
    exporter.run()
    before = (len(syslog.messages), len(otlp.records))

    syslog.stop()
    otlp.stop()  # both receivers down ...
    write_events(services, 25, start=15)  # ... while events keep coming
    write_usage(services, 5)
    down = exporter.run()
    assert down.streams["syslog/audit"].sent == 0 and down.streams["syslog/audit"].error
    assert down.streams["otlp/usage"].sent == 0 and down.streams["otlp/usage"].error
    stuck = {(c.sink, c.stream): c for c in siem_cursors.all_cursors(db)}
    assert stuck[("syslog", "audit")].last_error and stuck[("otlp", "audit")].last_error

    syslog.start()
    otlp.start()  # back, on the same ports
    up = exporter.run()
    assert not any(r.error for r in up.streams.values())

    head = head_seq(services)
    counts = {
        "audit events in the database": head, "usage rows in the database": 9,
        "syslog audit": len(audit_seqs_at(syslog)), "syslog usage": len(syslog.messages) - len(audit_seqs_at(syslog)),
        "otlp audit": len(otlp_seqs(otlp)), "otlp usage": len(otlp.records) - len(otlp_seqs(otlp)),
    }
    print(f"\n[{db.engine.dialect.name}] before the outage syslog/otlp: {before}; after: {counts}")
    assert counts["syslog audit"] == counts["otlp audit"] == head
    assert counts["syslog usage"] == counts["otlp usage"] == 9
    assert sorted(audit_seqs_at(syslog)) == list(range(1, head + 1))  # none lost, none twice
    assert sorted(otlp_seqs(otlp)) == list(range(1, head + 1))
    for c in siem_cursors.all_cursors(db):
        assert c.last_error is None
        assert c.position == (head if c.stream == "audit" else 9)
        assert c.exported == (head if c.stream == "audit" else 9)


def test_a_receiver_dropping_a_batch_midway_gets_it_again_and_only_it(
        database_url, db, redis_client, pki, receivers):
    """At least once: the batch the receiver did not finish reading is sent again whole; the
    batches acknowledged before it are never repeated."""
    syslog, otlp = receivers
    services = siem_services(database_url, db, pki, syslog, otlp, SIEM_STREAMS="audit")
    sinks = [s for s in build_sinks(services.settings) if s.name == "syslog"]
    exporter = Exporter(services, sinks)
    write_events(services, 13)
    exporter.run()
    acknowledged = len(syslog.messages)
    write_events(services, 7, start=13)
    syslog.read_limit = 3  # reads 3 of the next batch, then the connection drops (reset)
    failed = exporter.run()
    assert failed.streams["syslog/audit"].error
    exporter.run()
    seqs = audit_seqs_at(syslog)
    head = head_seq(services)
    repeated = sorted(seq for seq, n in Counter(seqs).items() if n > 1)
    assert sorted(set(seqs)) == list(range(1, head + 1))
    assert len(repeated) == 3 and min(repeated) > acknowledged  # only the batch in flight


def test_decrypting_payload_fields_is_explicit_and_audited(database_url, db, redis_client, pki, receivers):
    syslog, otlp = receivers
    services = siem_services(database_url, db, pki, syslog, otlp, SIEM_PAYLOAD_FIELDS="message_id,msg_type",
                             SIEM_STREAMS="audit")
    write_events(services, 3)
    Exporter(services, build_sinks(services.settings)).run()

    received = [m for m in syslog.messages if m["msgid"] == "message_received"]
    assert [m["sd"]["payload@32473"] for m in received] == [
        {"message_id": str(i), "msg_type": "text"} for i in range(3)]
    assert all("hush" not in repr(m) for m in syslog.messages)  # a field not listed stays sealed
    record = next(r for r in otlp.records if r["attributes"].get("audit.type") == "message_received")
    assert record["attributes"]["audit.payload.msg_type"] == "text"
    assert "audit.payload.secret_note" not in record["attributes"]
    policy = [m for m in syslog.messages if m["msgid"] == "export"]
    assert policy and all(m["sd"]["audit@32473"]["outcome"] == "siem" for m in policy)
    with db.reader() as session:
        from app.models import AuditEvent

        events = [services.audit.payload_of(e) for e in session.query(AuditEvent)
                  .filter(AuditEvent.event_type == EventType.EXPORT)]
    assert {e["payload_fields"] for e in events} == {"message_id,msg_type"}


def test_a_receiver_with_a_certificate_from_another_ca_is_refused(database_url, db, redis_client, pki, receivers):
    syslog, otlp = receivers
    services = siem_services(database_url, db, pki, syslog, otlp, SIEM_SYSLOG_CA_FILE=pki.other_ca,
                             SIEM_OTLP_CA_FILE=pki.other_ca, SIEM_STREAMS="audit")
    write_events(services, 2)
    result = Exporter(services, build_sinks(services.settings)).run()
    assert "certificate" in result.streams["syslog/audit"].error
    assert result.streams["otlp/audit"].error.startswith("tls")
    assert syslog.messages == [] and otlp.records == []
    assert all(c.position == 0 for c in siem_cursors.all_cursors(db))


def test_the_collector_refusing_or_asking_to_retry_keeps_the_cursor(database_url, db, redis_client, pki, receivers):
    syslog, otlp = receivers
    services = siem_services(database_url, db, pki, syslog, otlp, SIEM_STREAMS="audit")
    sinks = [s for s in build_sinks(services.settings) if s.name == "otlp"]
    write_events(services, 4)
    for status in (503, 400):
        otlp.answer_status = status
        result = Exporter(services, sinks).run()
        assert result.streams["otlp/audit"].error.startswith(f"HTTP {status}")
        assert siem_cursors.load(db, "otlp", "audit").position == 0
    otlp.answer_status = 200
    Exporter(services, sinks).run()
    assert sorted(otlp_seqs(otlp)) == list(range(1, head_seq(services) + 1))


def test_events_purged_before_a_sink_took_them_are_reported_and_skipped(
        database_url, db, redis_client, pki, receivers, caplog):
    from sqlalchemy import delete, select, update

    from app.models import AuditChain, AuditEvent

    syslog, otlp = receivers
    services = siem_services(database_url, db, pki, syslog, otlp, SIEM_STREAMS="audit")
    write_events(services, 6)
    # the first four purged past the retention, as a purge leaves it (the anchor moved to 4)
    with db.transaction() as session:
        anchor_hash = session.scalar(select(AuditEvent.row_hash).where(AuditEvent.seq == 4))
        session.execute(delete(AuditEvent).where(AuditEvent.seq <= 4))
        session.execute(update(AuditChain).where(AuditChain.id == 1)
                        .values(anchor_seq=4, anchor_hash=anchor_hash))
    sinks = [s for s in build_sinks(services.settings) if s.name == "syslog"]
    result = Exporter(services, sinks).run()
    assert result.streams["syslog/audit"].purged_unsent == 4
    assert "were purged before this sink took them" in caplog.text
    assert sorted(audit_seqs_at(syslog))[0] == 5


def test_the_beat_runs_the_export_only_when_a_sink_is_set(pki):
    from app.broker.task_queue import SIEM_EXPORT, make_celery

    off = make_celery(settings_from(make_env()))
    assert SIEM_EXPORT not in {e["task"] for e in off.conf.beat_schedule.values()}
    on = make_celery(settings_from(make_env(SIEM_OTLP_URL="https://collector.internal:4318/v1/logs",
                                            SIEM_INTERVAL_S="15")))
    entry = on.conf.beat_schedule["siem-export"]
    assert entry["task"] == SIEM_EXPORT and entry["schedule"] == 15.0


def test_status_shows_each_cursor_and_its_lag(database_url, db, redis_client, pki, receivers):
    from click.testing import CliRunner

    from app.siem.cli import siem_group

    syslog, otlp = receivers
    services = siem_services(database_url, db, pki, syslog, otlp, SIEM_STREAMS="audit")
    write_events(services, 3)
    runner = CliRunner()
    group = siem_group(lambda: services)
    assert runner.invoke(group, ["export"]).exit_code == 0
    write_events(services, 2, start=3)
    syslog.stop()
    failed = runner.invoke(group, ["export"])
    assert failed.exit_code == 1 and "syslog/audit: sent 0" in failed.output
    out = runner.invoke(group, ["status"]).output
    assert "otlp/audit: at 7, 0 behind, 7 sent payload=sealed" in out
    assert "syslog/audit: at 5, 2 behind, 5 sent payload=sealed; last run stopped: connect" in out
