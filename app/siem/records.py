"""What leaves for the SIEM: audit events and usage rows read in order past a cursor, as
``Record``s that both sinks format (``app.siem.syslog``, ``app.siem.otlp``).

**Audit events** are read by ``seq``. Seqs are taken under the chain head's lock and committed
in order (``app.audit.chain``), so a reader never sees seq n+1 before n: a cursor on ``seq`` skips
nothing. The payload is sealed (AES-GCM); it leaves sealed (its ciphertext, as the chain's
``row_hash`` covers it, so the SIEM's copy can be verified and read later by a key holder)
unless ``SIEM_PAYLOAD_FIELDS`` names fields to send decrypted as well (docs/siem.md).

**Usage rows** (spend: one row per model call) are read by ``id``. Ids come from a sequence and
the ledger writers of several processes commit in any order, so "everything up to the highest
id I can see" is not safe: a transaction holding a lower id may still commit. ``usage_horizon``
gives the id below which every row is final (see there); the export never passes it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select, text

from app.models import AuditChain, AuditEvent, UsageRecord

log = logging.getLogger(__name__)
AUDIT_TABLE = AuditEvent.__tablename__
WARNING_EVENTS = frozenset({"budget_block", "reply_failed", "budget_alert", "audit_purge",
                            "key_rotation", "export"})
_SEQUENCE_NAME = re.compile(r'^[A-Za-z0-9_."]{1,128}$')
HORIZON_WAIT_S = 5.0  # how long the usage horizon waits for the ledger writers in flight


@dataclass(frozen=True)
class Record:
    """One event for the SIEM. ``position``: its seq (audit) or row id (usage), what the cursor
    records; ``fields``: the structured data; ``clear``: payload fields sent decrypted."""

    stream: str  # audit | usage
    position: int
    at: datetime
    kind: str  # the audit event type, or "usage"
    warning: bool
    summary: str  # one ASCII line (syslog MSG, OTLP body)
    fields: dict[str, str | int] = field(default_factory=dict)
    clear: dict[str, str] = field(default_factory=dict)


def audit_batch(session, cipher, after: int, limit: int,
                clear_fields: frozenset[str] | None) -> list[Record]:
    """The audit events past ``after`` in seq order, at most ``limit``. ``clear_fields``: the
    payload fields to decrypt and send (None: all; empty: none, nothing is decrypted)."""
    rows = session.scalars(select(AuditEvent).where(AuditEvent.seq > after)
                           .order_by(AuditEvent.seq).limit(limit))
    return [audit_record(row, cipher, clear_fields) for row in rows]


def audit_record(row: AuditEvent, cipher, clear_fields: frozenset[str] | None) -> Record:
    fields: dict[str, str | int] = {
        "seq": row.seq, "type": row.event_type, "actor": row.actor, "outcome": row.outcome,
        "request_id": row.request_id or "", "fingerprint": row.fingerprint or "",
        "row_hash": row.row_hash, "prev_hash": row.prev_hash, "payload_sealed": row.payload_enc,
    }
    clear: dict[str, str] = {}
    if clear_fields is None or clear_fields:
        try:
            payload = json.loads(cipher.decrypt(row.payload_enc, AUDIT_TABLE, "payload_enc", row.seq))
        except Exception:  # noqa: BLE001 - a key no longer in the ring: the sealed copy still goes
            fields["payload_error"] = "not decryptable with the current keyring"
            payload = {}
        for name, value in (payload.items() if isinstance(payload, dict) else ()):
            if clear_fields is None or name in clear_fields:
                clear[str(name)] = value if isinstance(value, str) else json.dumps(
                    value, ensure_ascii=False, sort_keys=True, default=str)
    summary = f"audit seq={row.seq} {row.event_type} {_ascii(row.outcome)}"
    return Record("audit", row.seq, row.created_at, row.event_type,
                  row.event_type in WARNING_EVENTS, summary, fields, clear)


def audit_anchor(session) -> int:
    """The purge anchor: events up to it are gone (purged after the retention)."""
    head = session.get(AuditChain, 1, populate_existing=True)
    return head.anchor_seq if head is not None else 0


def audit_head(session) -> int:
    head = session.get(AuditChain, 1, populate_existing=True)
    return head.last_seq if head is not None else 0


def usage_batch(session, after: int, limit: int, horizon: int) -> list[Record]:
    """The usage rows past ``after`` and at most ``horizon``, in id order, at most ``limit``."""
    rows = session.scalars(select(UsageRecord).where(UsageRecord.id > after, UsageRecord.id <= horizon)
                           .order_by(UsageRecord.id).limit(limit))
    return [usage_record(row) for row in rows]


def usage_record(row: UsageRecord) -> Record:
    fields: dict[str, str | int] = {
        "id": row.id, "day": row.day.isoformat(), "user_hash": row.user_hash,
        "department": row.department or "", "api_key_id": row.api_key_id or "",
        "model": row.model, "prompt_tokens": row.prompt_tokens, "cached_tokens": row.cached_tokens,
        "completion_tokens": row.completion_tokens, "cost": str(row.cost), "currency": row.currency,
        "latency_ms": row.latency_ms, "message_id": row.message_id or 0,
        "price_id": row.price_id or 0,
    }
    summary = f"usage id={row.id} model={_ascii(row.model)} cost={row.cost} {row.currency}"
    return Record("usage", row.id, row.created_at, "usage", False, summary, fields)


def usage_horizon(db, wait_s: float = HORIZON_WAIT_S) -> int | None:
    """The highest usage row id below which no row can still appear; None when the ledger
    writers in flight did not finish within ``wait_s`` (try again next run).

    SQLite has one writer at a time, and a row's id is taken inside its write transaction: every
    id up to the highest committed one is final. PostgreSQL hands ids out from a sequence to
    writers that commit in any order. Every INSERT into ``usage_records`` takes its
    ``RowExclusiveLock`` on the table before it draws an id (the executor opens its target
    first), so: read the sequence's last id, then list the transactions holding that lock, and
    wait until they have all ended (``CREATE INDEX CONCURRENTLY``'s "wait for lockers"). Any
    transaction that drew an id up to that last one held the lock when we looked, so once
    those are gone every such row is committed or never will be. Nobody waits for us: the
    ledger's writers are never blocked.
    """
    with db.reader() as session:
        if session.get_bind().dialect.name != "postgresql":
            return int(session.scalar(select(func.coalesce(func.max(UsageRecord.id), 0))))
        sequence = session.scalar(text("SELECT pg_get_serial_sequence('usage_records', 'id')"))
        if not sequence or not _SEQUENCE_NAME.match(sequence):
            raise RuntimeError("usage_records.id has no sequence PostgreSQL can name")
        last = session.scalar(text(  # a name PostgreSQL gave, checked above
            f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {sequence}"))  # noqa: S608
        holders = [r[0] for r in session.execute(text(
            "SELECT DISTINCT virtualtransaction FROM pg_locks WHERE locktype = 'relation' "
            "AND relation = 'usage_records'::regclass AND mode = 'RowExclusiveLock' "
            "AND pid IS DISTINCT FROM pg_backend_pid()"))]
    deadline = time.monotonic() + wait_s
    delay = 0.005
    while holders:
        with db.reader() as session:
            holders = [r[0] for r in session.execute(text(
                "SELECT DISTINCT virtualtransaction FROM pg_locks "
                "WHERE virtualtransaction = ANY(:holders)"), {"holders": holders})]
        if not holders:
            break
        if time.monotonic() >= deadline:
            log.info("siem: %d ledger transactions still open after %.1f s; usage waits a run",
                     len(holders), wait_s)
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    return int(last or 0)


def _ascii(value: str) -> str:
    return "".join(c if " " < c <= "~" else "?" for c in (value or "-"))
