"""Audit search and the signed export zip: web and CLI, verification, tampering."""

from __future__ import annotations

import io
import json
import zipfile

from sqlalchemy import select

from app.admin import audit_export
from app.audit import EventType
from app.models import AuditEvent
from app.outbox import user_hash
from tests.admin.conftest import post


def _events(services, n=3):
    zhang = user_hash(services.blind_index, "zhangsan")
    with services.db.transaction() as session:
        for i in range(n):
            services.audit.append(session, EventType.MESSAGE_RECEIVED, actor=zhang,
                                  payload={"message_id": i, "text": "你好"})
        services.audit.append(session, EventType.REPLY_SENT,
                              actor=user_hash(services.blind_index, "lisi"), payload={"n": 1})
    return zhang


def _export(client, reason="quarterly compliance review Q4"):
    return post(client, "/admin/audit/export", {"reason": reason, "since": "", "until": "",
                                                 "user": "", "type": ""}, form_page="/admin/audit")


def test_search_by_user_and_type(as_role, services):
    zhang = _events(services)
    client = as_role("auditor")
    page = client.get("/admin/audit?user=zhangsan").get_data(as_text=True)
    assert page.count("<td>message_received</td>") == 3 and "<td>reply_sent</td>" not in page
    assert zhang[:12] in page and "zhangsan" not in page.split("<table>")[1]
    page = client.get("/admin/audit?type=reply_sent").get_data(as_text=True)
    assert "<td>reply_sent</td>" in page and "<td>message_received</td>" not in page
    bad = client.get("/admin/audit?since=2027-02-02&until=2027-02-01").get_data(as_text=True)
    assert "the end date is before the start date" in bad


def test_export_needs_a_reason_and_verifies(as_role, services):
    _events(services)
    client = as_role("auditor")
    refused = _export(client, reason="")
    assert refused.status_code == 400 and "give the reason" in refused.get_data(as_text=True)

    response = _export(client)
    assert response.status_code == 200 and response.mimetype == "application/zip"
    assert "attachment" in response.headers["Content-Disposition"]
    data = response.get_data()
    secret = services.settings.secret_key.get_secret_value()
    assert audit_export.verify_export(io.BytesIO(data), secret) == []

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        lines = archive.read("audit.jsonl").decode().splitlines()
        csv_text = archive.read("audit.csv").decode()
    # the 4 events, the auditor's login and the export event itself (written before streaming)
    assert manifest["rows"] == len(lines) == 6 and manifest["files"]["audit.csv"]["rows"] == 6
    assert manifest["chain"]["verified"] is True and manifest["reason"].startswith("quarterly")
    assert manifest["last_hash"] == json.loads(lines[-1])["row_hash"]
    assert "你好" in csv_text and csv_text.startswith("seq,created_at,event_type")
    export_event = json.loads(lines[-1])
    assert export_event["event_type"] == "export" and export_event["actor"] == "admin:otto"
    assert export_event["payload"]["reason"] == "quarterly compliance review Q4"

    assert audit_export.verify_export(io.BytesIO(data), "another server's secret key......") == [
        "manifest signature does not verify (changed, or another server's key)"]
    # After a SECRET_KEY rotation the export still verifies with the old key named as previous.
    assert audit_export.verify_export(io.BytesIO(data), "the rotated-to secret key.........",
                                      [secret]) == []


def _rewrite(data: bytes, change) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for name in source.namelist():
            target.writestr(name, change(name, source.read(name)))
    return out.getvalue()


def test_cli_export_and_tampered_zip_fails(app, services, tmp_path):
    _events(services)
    runner = app.test_cli_runner()
    out = tmp_path / "export.zip"
    result = runner.invoke(args=["audit", "export", "--out", str(out),
                                 "--reason", "court order 2026-117"])
    assert result.exit_code == 0, result.output
    ok = runner.invoke(args=["audit", "verify-export", str(out)])
    assert ok.exit_code == 0 and "export ok" in ok.output

    data = out.read_bytes()
    changed_row = tmp_path / "row.zip"
    changed_row.write_bytes(_rewrite(data, lambda name, body: body.replace(b'"n": 1', b'"n": 2')
                                     if name == "audit.jsonl" else body))
    broken = runner.invoke(args=["audit", "verify-export", str(changed_row)])
    assert broken.exit_code == 1 and "audit.jsonl: SHA-256 differs" in broken.output

    def lie_about_rows(name, body):
        if name != "manifest.json":
            return body
        manifest = json.loads(body)
        manifest["rows"] = 1
        return json.dumps(manifest).encode()

    forged = tmp_path / "manifest.zip"
    forged.write_bytes(_rewrite(data, lie_about_rows))
    broken = runner.invoke(args=["audit", "verify-export", str(forged)])
    assert broken.exit_code == 1 and "signature does not verify" in broken.output

    with services.db.session() as session:
        event = session.scalars(select(AuditEvent).where(AuditEvent.event_type == "export")).one()
        assert services.audit.payload_of(event)["reason"] == "court order 2026-117"


def test_export_streams_in_bounded_chunks(services, monkeypatch):
    monkeypatch.setattr(audit_export, "CHUNK", 4096)
    monkeypatch.setattr(audit_export, "BATCH", 50)
    _events(services, n=400)
    from datetime import UTC, datetime

    query = audit_export.ExportQuery(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
    chunks = list(audit_export.export_stream(services, query, reason="test", exported_by="test"))
    sizes = [len(c) for c in chunks]
    # Handed out as it is made (deflate emits ~16 KiB bursts), never the whole zip at once.
    assert len(sizes) >= 4 and max(sizes) < 32 * 1024 < sum(sizes)
    data = b"".join(chunks)
    assert audit_export.verify_export(io.BytesIO(data), services.settings.secret_key.get_secret_value()) == []


def test_cli_export_range_and_type(app, services, tmp_path):
    _events(services)
    runner = app.test_cli_runner()
    out = tmp_path / "replies.zip"
    result = runner.invoke(args=["audit", "export", "--out", str(out), "--type", "reply_sent",
                                 "--since", "2000-01-01", "--until", "2099-12-31",
                                 "--reason", "reply audit for ticket 42"])
    assert result.exit_code == 0, result.output
    with zipfile.ZipFile(out) as archive:
        manifest = json.loads(archive.read("manifest.json"))
    assert manifest["rows"] == 1 and manifest["query"]["event_type"] == "reply_sent"
    empty = tmp_path / "none.zip"
    result = runner.invoke(args=["audit", "export", "--out", str(empty), "--until", "2001-01-01",
                                 "--reason", "nothing should match here"])
    assert result.exit_code == 0 and "0 events" in result.output
    assert runner.invoke(args=["audit", "verify-export", str(empty)]).exit_code == 0
    assert runner.invoke(args=["audit", "export", "--out", str(empty), "--reason", "why"]).exit_code != 0
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not a zip")
    broken = runner.invoke(args=["audit", "verify-export", str(junk)])
    assert broken.exit_code == 1 and "not a readable zip" in broken.output
