"""Audit search and the signed export zip: web and CLI, verification, tampering."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select

from app.audit import signing as audit_signing
from app.audit.chain import EventType
from app.cli import cli
from app.models import AuditEvent
from app.outbox.rows import user_hash
from app.web.admin import audit_export
from tests.app.web.admin.conftest import post


def _events(services, n=3):
    zhang = user_hash(services.blind_index, "zhangsan")
    with services.db.transaction() as session:
        for i in range(n):
            services.audit.append(session, EventType.MESSAGE_RECEIVED, actor=zhang,
                                  payload={"message_id": i, "text": "你好"})
        services.audit.append(session, EventType.REPLY_SENT,
                              actor=user_hash(services.blind_index, "lisi"), payload={"n": 1})
    return zhang


def public_key(services):
    return audit_signing.signing_key(services.settings).public_key()


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
    assert audit_export.verify_export(io.BytesIO(data), public_key(services)) == []

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

    assert manifest["signature_alg"] == "Ed25519"
    assert manifest["signing_key_id"] == audit_signing.key_id(public_key(services))
    # Another server's public key does not fit; SECRET_KEY plays no part in the signature.
    other = Ed25519PrivateKey.generate().public_key()
    assert audit_export.verify_export(io.BytesIO(data), other) == [
        "manifest signature does not verify (changed, or signed by another key)"]


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
    assert audit_export.verify_export(io.BytesIO(data), public_key(services)) == []


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


# -- an outside auditor: the public key alone ---------------------------------------------------
@pytest.fixture
def exported(app, services, tmp_path):
    """An export and the server's public key as files, as an auditor receives them."""
    _events(services)
    runner = app.test_cli_runner()
    out = tmp_path / "export.zip"
    result = runner.invoke(args=["audit", "export", "--out", str(out), "--reason", "external audit 2026"])
    assert result.exit_code == 0, result.output
    pem = runner.invoke(args=["audit", "public-key"])
    assert pem.exit_code == 0 and pem.output.startswith("-----BEGIN PUBLIC KEY-----")
    key = tmp_path / "server.pub.pem"
    key.write_text(pem.output)
    return out, key


def auditor_verifies(path, key):
    """``verify-export --public-key`` outside the app: no settings, no server secret at hand."""
    return CliRunner().invoke(cli, ["audit", "verify-export", str(path), "--public-key", str(key)],
                              env={"SECRET_KEY": "", "DATA_KEYS": ""})


def _jsonl_without_row(body: bytes, seq: int) -> bytes:
    return b"".join(line for line in body.splitlines(keepends=True)
                    if json.loads(line)["seq"] != seq)


def _resigned(data: bytes, key: Ed25519PrivateKey, change) -> bytes:
    """``change`` applied to audit.jsonl, the manifest's digests and counts made to fit, and
    the manifest signed with ``key``: the best a forger without the server's key can do."""
    import hashlib

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        body = change(archive.read("audit.jsonl"))
        manifest = json.loads(archive.read("manifest.json"))
    manifest["files"]["audit.jsonl"] = {"sha256": hashlib.sha256(body).hexdigest(),
                                        "rows": len(body.splitlines())}
    manifest["rows"] = len(body.splitlines())
    manifest["signature"] = audit_signing.sign(manifest, key)
    out = json.dumps(manifest).encode()
    return _rewrite(data, lambda name, old: body if name == "audit.jsonl" else
                    out if name == "manifest.json" else old)


def test_an_auditor_verifies_with_the_public_key_alone(exported):
    out, key = exported
    result = auditor_verifies(out, key)
    assert result.exit_code == 0, result.output
    assert "export ok: Ed25519 signature" in result.output


TAMPERS = {
    "edited row": lambda data: _rewrite(data, lambda name, body: body.replace(b'"n": 1', b'"n": 2')
                                        if name == "audit.jsonl" else body),
    "removed row": lambda data: _rewrite(data, lambda name, body: _jsonl_without_row(body, 2)
                                         if name == "audit.jsonl" else body),
    "edited row, manifest re-signed by another key": lambda data: _resigned(
        data, Ed25519PrivateKey.generate(), lambda body: body.replace(b'"n": 1', b'"n": 2')),
    "removed row, manifest re-signed by another key": lambda data: _resigned(
        data, Ed25519PrivateKey.generate(), lambda body: _jsonl_without_row(body, 2)),
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_every_export_tamper_is_found_with_the_public_key(exported, tmp_path, tamper):
    out, key = exported
    forged = tmp_path / "forged.zip"
    forged.write_bytes(TAMPERS[tamper](out.read_bytes()))
    result = auditor_verifies(forged, key)
    assert result.exit_code == 1 and "export BROKEN" in result.output, result.output


def test_a_signature_swapped_from_another_export_is_found(app, exported, tmp_path):
    out, key = exported
    second = tmp_path / "second.zip"
    assert app.test_cli_runner().invoke(args=["audit", "export", "--out", str(second), "--reason",
                                              "a second, later export"]).exit_code == 0
    with zipfile.ZipFile(second) as archive:
        signature = json.loads(archive.read("manifest.json"))["signature"]

    def swap(name, body):
        if name != "manifest.json":
            return body
        manifest = json.loads(body)
        assert manifest["signature"] != signature
        manifest["signature"] = signature
        return json.dumps(manifest).encode()

    forged = tmp_path / "swapped.zip"
    forged.write_bytes(_rewrite(out.read_bytes(), swap))
    result = auditor_verifies(forged, key)
    assert result.exit_code == 1 and "signature does not verify" in result.output


def test_the_public_key_cannot_sign_and_another_server_key_does_not_verify(exported, tmp_path):
    out, key = exported
    public = audit_signing.load_public_key(key.read_bytes())
    assert not hasattr(public, "sign")  # a verifier holds no signing capability
    other = tmp_path / "other.pub.pem"
    other.write_text(audit_signing.public_pem(Ed25519PrivateKey.generate()))
    result = auditor_verifies(out, other)
    assert result.exit_code == 1 and "signature does not verify" in result.output


def test_an_export_needs_a_signing_key(app, as_role, services, monkeypatch, tmp_path):
    monkeypatch.setattr(services.settings, "audit_export_key", None)
    result = app.test_cli_runner().invoke(args=["audit", "export", "--out", str(tmp_path / "x.zip"),
                                                "--reason", "no key configured here"])
    assert result.exit_code != 0 and "AUDIT_EXPORT_KEY" in result.output
    refused = _export(as_role("auditor"))
    assert refused.status_code == 503 and "AUDIT_EXPORT_KEY" in refused.get_data(as_text=True)
    with services.db.session() as session:  # refused before the export event is written
        assert not session.scalars(select(AuditEvent).where(AuditEvent.event_type == "export")).all()


def _with_members(data: bytes, before: list[tuple[str, bytes]] = (), after: list[tuple[str, bytes]] = (),
                  comment: bytes = b"") -> bytes:
    """The signed export's members in order, with others put before and after them."""
    import warnings

    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w") as target:
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name: the forgery's point
        for name, body in [*before, *((n, source.read(n)) for n in source.namelist()), *after]:
            target.writestr(name, body)
        target.comment = comment
    return out.getvalue()


FORGED_CSV = b"seq,created_at,event_type,actor,outcome\n1,2026-01-01,admin_login,admin:nobody,ok\n"
UNSIGNED = {
    "a forged audit.csv before the real one": dict(before=[("audit.csv", FORGED_CSV)]),
    "a forged manifest.json before the real one": dict(before=[("manifest.json", b"{}")]),
    "a second audit.jsonl after the real one": dict(after=[("audit.jsonl", b"{}\n")]),
    "a member the manifest does not list": dict(after=[("README.txt", b"the real rows are elsewhere")]),
    "a zip comment": dict(comment=b"approved by the auditor"),
}


@pytest.mark.parametrize("how", list(UNSIGNED))
def test_duplicate_or_unsigned_members_are_refused(exported, tmp_path, how):
    """A reader taking the first member of a name would show a forgery that the signed one
    hides behind; whatever the manifest does not sign is refused too."""
    out, key = exported
    forged = tmp_path / "forged.zip"
    forged.write_bytes(_with_members(out.read_bytes(), **UNSIGNED[how]))
    result = auditor_verifies(forged, key)
    assert result.exit_code == 1 and "export BROKEN" in result.output, result.output
