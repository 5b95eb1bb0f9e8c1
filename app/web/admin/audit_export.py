"""Compliance export of the audit log: a zip streamed in constant memory, and its verification.

The zip holds ``audit.csv`` and ``audit.jsonl`` (the same events, payloads decrypted) and
``manifest.json``: per-file SHA-256 and row counts, the time range and filters, the first and
last chain hash of the exported rows, the chain head and the result of verifying the whole chain
at export time, who exported and why, and ``signature``: Ed25519 over the canonical JSON of
everything else (``app.audit.signing``; the key ``AUDIT_EXPORT_KEY``). ``verify_export`` checks
all of it with the public key alone; a changed byte in any member, or a changed manifest, fails.

Constant memory: ``zipfile`` writes into ``_Sink``, an unseekable stream whose buffer the
generator hands out and empties every ``CHUNK`` bytes (zipfile then writes data descriptors
instead of seeking back), and the rows are read once, in keyset batches of short sessions (no
long transaction holds SQLite's write lock while a slow client downloads): each row's payload is
decrypted once, its CSV line goes into the zip at once and its JSONL line into a gzip-compressed
temporary file, copied into the zip after the CSV member (members are written one after the
other). Memory stays flat whatever the row count; disk holds the compressed JSONL meanwhile.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import hashlib
import io
import json
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select

from app.audit import signing as audit_signing
from app.db import utcnow
from app.models import AuditChain, AuditEvent

FORMAT = "wecom-bot-audit-export/2"  # /1 was signed with an HMAC of SECRET_KEY
CSV_NAME, JSONL_NAME, MANIFEST_NAME = "audit.csv", "audit.jsonl", "manifest.json"
COLUMNS = ("seq", "created_at", "event_type", "actor", "outcome", "request_id", "fingerprint",
           "payload", "prev_hash", "row_hash")
CHUNK = 64 * 1024
BATCH = 500


@dataclass(frozen=True)
class ExportQuery:
    since: datetime
    until: datetime  # exclusive
    event_type: str | None = None
    actor: str | None = None  # a blind index or an admin actor, as stored
    # The same user's blind index under BLIND_INDEX_KEY's older keys: audit rows keep the one
    # they were written with (``keys rotate-index`` cannot move what the chain seals).
    older_actors: tuple[str, ...] = ()

    def conditions(self):
        out = [AuditEvent.created_at >= self.since, AuditEvent.created_at < self.until]
        if self.event_type:
            out.append(AuditEvent.event_type == self.event_type)
        if self.actor:
            out.append(AuditEvent.actor.in_((self.actor, *self.older_actors)))
        return out

    def as_json(self) -> dict:
        return {"since": self.since.astimezone(UTC).isoformat(),
                "until": self.until.astimezone(UTC).isoformat(),
                "event_type": self.event_type, "actor": self.actor}


class _Sink(io.RawIOBase):
    """A write-only, unseekable stream; the generator empties it."""

    def __init__(self):
        self.buffer = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.buffer += data
        return len(data)

    def drain(self) -> bytes:
        data = bytes(self.buffer)
        self.buffer.clear()
        return data


@contextlib.contextmanager
def _snapshot(readers):
    """``app.audit.chain.snapshot`` from a given session factory: one snapshot for every statement."""
    with readers() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        yield session


def count_rows(db, query: ExportQuery) -> int:
    with db.replica_reader() as session:
        return session.scalar(select(func.count()).select_from(AuditEvent)
                              .where(*query.conditions())) or 0


def _events(services, readers, query: ExportQuery, upto_seq: int) -> Iterator[dict]:
    """The matching events up to ``upto_seq``, decrypted, in keyset batches of short sessions.

    Plain column rows (no ORM objects): the export reads every row once, and what it costs per
    row is the payload's decryption, not object bookkeeping.
    """
    table, after = AuditEvent.__table__, 0
    while True:
        with readers() as session:
            rows = session.execute(select(table).where(
                table.c.seq > after, table.c.seq <= upto_seq, *query.conditions())
                .order_by(table.c.seq).limit(BATCH)).all()
            batch = [_as_dict(services.audit, row) for row in rows]
        if not batch:
            return
        yield from batch
        after = batch[-1]["seq"]


def _as_dict(audit, row) -> dict:
    try:
        payload = audit.payload_of(row)
    except Exception:  # noqa: BLE001 - a row that does not decrypt is exported as such
        payload = {"_error": "payload does not decrypt"}
    return {"seq": row.seq, "created_at": row.created_at.astimezone(UTC).isoformat(),
            "event_type": row.event_type, "actor": row.actor, "outcome": row.outcome,
            "request_id": row.request_id or "", "fingerprint": row.fingerprint or "",
            "payload": payload, "prev_hash": row.prev_hash, "row_hash": row.row_hash}


def _csv_line(values) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(values)
    return out.getvalue().encode()


def _encode_csv(event: dict) -> bytes:
    return _csv_line([json.dumps(event[c], ensure_ascii=False, sort_keys=True) if c == "payload"
                      else event[c] for c in COLUMNS])


def _encode_jsonl(event: dict) -> bytes:
    return (json.dumps(event, ensure_ascii=False, sort_keys=True) + "\n").encode()


def _spool_writer(raw) -> gzip.GzipFile:
    """Fast compression for the JSONL spool: disk use a fraction of the text, little CPU."""
    return gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1)


def export_stream(services, query: ExportQuery, *, reason: str, exported_by: str,
                  progress: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """Yield the export zip's bytes, chunk by chunk (``SigningKeyMissing`` before the first)."""
    key = audit_signing.signing_key(services.settings)
    # The replica when one is set and up, chosen once: the chain head and every batch come from
    # the same server (a lagging replica still exports a consistent, verified prefix).
    readers = services.db.report_sessions()
    with _snapshot(readers) as session:
        report = services.audit.verify(session)
        head = session.get(AuditChain, 1)
        head_seq, head_hash, anchor_seq = head.last_seq, head.last_hash, head.anchor_seq
    sink = _Sink()
    archive = zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED)
    csv_digest, jsonl_digest = hashlib.sha256(_csv_line(COLUMNS)), hashlib.sha256()
    rows, first, last = 0, None, None
    with tempfile.TemporaryFile(prefix="audit-export-") as raw_spool:
        # One read of the rows: the CSV goes into the zip as it is made, the JSONL lines into a
        # compressed temporary file (a zip member must be written whole before the next).
        with archive.open(CSV_NAME, "w", force_zip64=True) as member, \
                _spool_writer(raw_spool) as spool:
            member.write(_csv_line(COLUMNS))
            for event in _events(services, readers, query, head_seq):
                line = _encode_csv(event)
                csv_digest.update(line)
                member.write(line)
                line = _encode_jsonl(event)
                jsonl_digest.update(line)
                spool.write(line)
                rows += 1
                first = first or event
                last = event
                if progress is not None:
                    progress(1)
                if len(sink.buffer) >= CHUNK:
                    yield sink.drain()
        yield sink.drain()
        raw_spool.seek(0)
        with archive.open(JSONL_NAME, "w", force_zip64=True) as member, \
                gzip.GzipFile(fileobj=raw_spool, mode="rb") as spool:
            for block in iter(lambda: spool.read(CHUNK), b""):
                member.write(block)
                if len(sink.buffer) >= CHUNK:
                    yield sink.drain()
        yield sink.drain()
    files = {CSV_NAME: {"sha256": csv_digest.hexdigest(), "rows": rows},
             JSONL_NAME: {"sha256": jsonl_digest.hexdigest(), "rows": rows}}
    manifest = {
        "format": FORMAT,
        "created_at": utcnow().isoformat(),
        "exported_by": exported_by,
        "reason": reason,
        "query": query.as_json(),
        "files": files,
        "rows": files[JSONL_NAME]["rows"],
        "first_seq": first["seq"] if first else None,
        "last_seq": last["seq"] if last else None,
        "first_prev_hash": first["prev_hash"] if first else None,
        "first_hash": first["row_hash"] if first else None,
        "last_hash": last["row_hash"] if last else None,
        "chain": {"verified": report.ok, "issues": [str(i) for i in report.issues[:50]],
                  "issue_count": len(report.issues), "head_seq": head_seq,
                  "head_hash": head_hash, "anchor_seq": anchor_seq},
        "signature_alg": audit_signing.ALGORITHM,
        "signing_key_id": audit_signing.key_id(key.public_key()),
    }
    manifest["signature"] = audit_signing.sign(manifest, key)
    archive.writestr(MANIFEST_NAME, json.dumps(manifest, ensure_ascii=False, indent=2,
                                               sort_keys=True))
    archive.close()
    yield sink.drain()


# -- verification ------------------------------------------------------------------------------------
def verify_export(path_or_file, public_key) -> list[str]:
    """Every problem found in an export zip (an empty list: it is intact and signed by the
    holder of ``public_key``'s private half: an Ed25519 public key, or its PEM)."""
    if not isinstance(public_key, audit_signing.Ed25519PublicKey):
        public_key = audit_signing.load_public_key(public_key)
    problems: list[str] = []
    try:
        archive = zipfile.ZipFile(path_or_file)
    except (zipfile.BadZipFile, OSError) as exc:
        return [f"not a readable zip: {exc}"]
    with archive:
        # Each member once, nothing beside the signed ones: zipfile's open(name) reads the last
        # member of a name, another reader the first (a forged audit.csv placed before the real
        # one); a comment or a member the manifest does not list is unsigned content.
        listed = archive.namelist()
        duplicates = sorted({name for name in listed if listed.count(name) > 1})
        if duplicates:
            return [f"members named more than once (a second copy hides behind the signed one): "
                    f"{duplicates}"]
        names = set(listed)
        if MANIFEST_NAME not in names:
            return ["manifest.json is missing"]
        if archive.comment:
            problems.append("the zip carries a comment, which nothing signs")
        try:
            manifest = json.loads(archive.read(MANIFEST_NAME))
        except (ValueError, zipfile.BadZipFile) as exc:
            return [f"manifest.json does not parse: {exc}"]
        if not isinstance(manifest, dict):
            return ["manifest.json is not an object"]
        if manifest.get("format") != FORMAT:
            problems.append(f"format {manifest.get('format')!r}, not {FORMAT!r} (an HMAC-signed "
                            "export from before Ed25519 cannot be checked with a public key)")
        elif not audit_signing.verify(manifest, public_key):
            problems.append("manifest signature does not verify (changed, or signed by another key)")
        files = manifest.get("files")
        if not isinstance(files, dict) or set(files) != {CSV_NAME, JSONL_NAME}:
            return [*problems, f"the manifest must list exactly {CSV_NAME} and {JSONL_NAME}"]
        expected = set(files) | {MANIFEST_NAME}
        if names - expected:
            problems.append(f"members the manifest does not sign: {sorted(names - expected)}")
        for name, meta in manifest.get("files", {}).items():
            if name not in names:
                problems.append(f"{name} is missing")
                continue
            try:
                digest, rows = _digest_and_rows(archive, name, manifest, problems)
            except (zipfile.BadZipFile, ValueError, KeyError) as exc:
                problems.append(f"{name} does not read: {exc}")
                continue
            if digest != meta.get("sha256"):
                problems.append(f"{name}: SHA-256 differs from the manifest")
            if rows != meta.get("rows"):
                problems.append(f"{name}: {rows} rows, the manifest says {meta.get('rows')}")
    return problems


def _digest_and_rows(archive, name: str, manifest: dict, problems: list[str]) -> tuple[str, int]:
    digest = hashlib.sha256()
    with archive.open(name) as member:
        for block in iter(lambda: member.read(CHUNK), b""):
            digest.update(block)
    rows = 0
    with archive.open(name) as member:
        text = io.TextIOWrapper(member, encoding="utf-8", newline="")
        if name == CSV_NAME:
            reader = csv.reader(text)
            next(reader, None)
            rows = sum(1 for _ in reader)
        else:
            rows = _check_links(text, manifest, problems)
    return digest.hexdigest(), rows


def _check_links(lines, manifest: dict, problems: list[str]) -> int:
    """Consecutive exported rows must link (prev_hash = the previous row_hash); ends as stated."""
    rows, previous = 0, None
    for line in lines:
        event = json.loads(line)
        rows += 1
        if rows == 1 and event.get("row_hash") != manifest.get("first_hash"):
            problems.append("the first row is not the one the manifest names")
        if previous is not None and event["seq"] == previous["seq"] + 1 \
                and event["prev_hash"] != previous["row_hash"]:
            problems.append(f"seq {event['seq']} does not link to seq {previous['seq']}")
        previous = event
    if previous is not None and previous.get("row_hash") != manifest.get("last_hash"):
        problems.append("the last row is not the one the manifest names")
    return rows
