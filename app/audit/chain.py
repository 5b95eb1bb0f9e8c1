"""The audit log: append-only events in one hash chain, with an encrypted payload.

Each event row carries ``seq`` (1, 2, 3, ... without gaps), time, actor (a user's blind index or
an admin's name), type, outcome, request id, a request fingerprint and the payload, AES-GCM
sealed to ``audit_events.payload_enc:<seq>``. ``row_hash`` is HMAC-SHA256 over a canonical
serialization of all of those columns *and* ``prev_hash`` (the previous row's ``row_hash``), keyed
by a key derived from ``SECRET_KEY`` (``app.audit.keys``): without the server secret a row cannot
be changed, inserted, moved or dropped and the chain re-sealed to hide it.

Appending is serialized by the chain's head row (``audit_chain``, id 1): on PostgreSQL
``SELECT ... FOR UPDATE``, on SQLite a write to it first, which takes SQLite's single write lock
(what ``BEGIN IMMEDIATE`` would). The head holds the last link and the purge anchor and carries
its own MAC (``app.audit.head``), so an insider who can write the database cannot move it to a
truncated tail, reset it, or re-anchor it. What changes the chain's shape is itself a sealed
event that ``verify`` checks (``app.audit.checks``): ``audit_purge`` (the anchor a purge left),
``key_rotation`` with a ``chain_key`` (written by the first append under a new ``SECRET_KEY``;
the old key is good only for rows before it) and ``audit_checkpoint`` (every
``AUDIT_CHECKPOINT_MINUTES``, so a head replayed from before a cut tail shows as stale). The head
may also be copied outside the database (``AUDIT_HEAD_FILE``) and compared by ``verify``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from app.audit.checks import ChainChecks
from app.audit.head import FORKED, Coalesced, Head, HeadFile
from app.audit.keys import ChainKeys, chain_key
from app.db import utcnow
from app.models import AuditChain, AuditEvent
from app.outbox.statements import DriverStatements
from app.security import FieldCipher

log = logging.getLogger(__name__)
TABLE = AuditEvent.__tablename__
GENESIS = "0" * 64
MIN_RETENTION_DAYS = 180
MOVE_SEARCH = 64  # how far from its place verify looks for a moved row's original seq
__all__ = ["AuditLog", "ChainBroken", "Event", "EventType", "chain_key", "request_fingerprint"]


class EventType:
    MESSAGE_RECEIVED = "message_received"
    REPLY_SENT = "reply_sent"
    REPLY_FAILED = "reply_failed"
    BUDGET_ALERT = "budget_alert"
    BUDGET_BLOCK = "budget_block"
    ADMIN_LOGIN = "admin_login"
    ADMIN_CHANGE = "admin_change"
    EXPORT = "export"
    KEY_ROTATION = "key_rotation"  # data keys (keys rotate) or, with a chain_key, SECRET_KEY
    API_REQUEST = "api_request"  # one per authenticated /v1 call (app.web.api)
    AUDIT_PURGE = "audit_purge"  # the anchor a purge left (through_seq, anchor_hash)
    AUDIT_CHECKPOINT = "audit_checkpoint"  # the beat's periodic reseal of the head
    FEEDBACK = "feedback"  # a rating of an answer or a /feedback comment (app.feedback.ratings)
    TOOL_CALL = "tool_call"  # one MCP tool call for an asker, or its confirmation (worker.tools)
    ALL = (MESSAGE_RECEIVED, REPLY_SENT, REPLY_FAILED, BUDGET_ALERT, BUDGET_BLOCK, ADMIN_LOGIN,
           ADMIN_CHANGE, EXPORT, KEY_ROTATION, API_REQUEST, AUDIT_PURGE, AUDIT_CHECKPOINT, FEEDBACK,
           TOOL_CALL)


def request_fingerprint(secret: bytes | str, remote_addr: str | None, user_agent: str | None,
                        at: datetime | None = None) -> str:
    """HMAC-SHA256(secret, remote address + User-Agent + UTC hour ``YYYYMMDDHH``).

    Keyed, because a plain hash of an IP and a common User-Agent is easily brute-forced back.
    """
    key = secret.encode() if isinstance(secret, str) else secret
    hour = (at or utcnow()).astimezone(UTC).strftime("%Y%m%d%H")
    message = "\n".join([remote_addr or "", user_agent or "", hour]).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Event:
    """An event to append: what ``AuditLog.append`` takes, for many at once."""

    event_type: str
    actor: str
    outcome: str = "ok"
    payload: dict | None = None
    request_id: str | None = None
    fingerprint: str | None = None


@dataclass(slots=True, kw_only=True)
class EventRow:
    """An appended event as written (``AuditEvent``'s columns, without the ORM's bookkeeping)."""

    seq: int
    created_at: datetime
    event_type: str
    actor: str
    outcome: str
    request_id: str | None
    fingerprint: str | None
    payload_enc: str
    prev_hash: str
    row_hash: str = ""


@dataclass(frozen=True)
class Issue:
    kind: str  # changed | inserted | deleted | reordered | head | anchor | link | key | purge
    #   | stale | payload | external (app.audit.checks, AuditLog._check_copy)
    seq: int
    detail: str

    def __str__(self) -> str:
        return f"seq {self.seq}: {self.kind} - {self.detail}"


@dataclass
class VerifyReport:
    rows: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    anchor_seq: int = 0
    issues: list[Issue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.issues


class ChainBroken(RuntimeError):
    def __init__(self, report: VerifyReport):
        super().__init__("audit chain does not verify: " + "; ".join(map(str, report.issues[:5])))
        self.report = report


class AuditLog:
    def __init__(self, cipher: FieldCipher, secret: bytes | str, previous_secrets: list = (), *,
                 checkpoint_minutes: int = 0, head_file: str | None = None, stale_minutes: int = 0):
        """``previous_secrets``: SECRET_KEYs before a rotation, whose rows still verify (up to
        the rotation event). ``checkpoint_minutes``: how often the beat writes a checkpoint; 0:
        none, and no staleness check. ``head_file``: the head's copy outside the database.
        ``stale_minutes``: how old a head (or copy) may be before ``verify`` reports it (0:
        twice ``checkpoint_minutes``)."""
        self.cipher = cipher
        self.keys = ChainKeys(secret, previous_secrets)
        self.checkpoint_minutes = checkpoint_minutes
        self.stale_minutes = stale_minutes
        self.head_file = HeadFile(head_file) if head_file else None
        self._copier: Coalesced | None = None

    # -- sealing -------------------------------------------------------------------------------
    def seal(self, row: AuditEvent, seq: int | None = None, key: bytes | None = None) -> str:
        """The row's MAC as if it stood at ``seq`` (default: where it stands), under the
        current chain key unless ``key`` names an old one."""
        return hmac.new(key or self.keys.current, _canonical(row, seq), hashlib.sha256).hexdigest()

    def signer(self, row: AuditEvent, seq: int | None = None) -> int | None:
        """The rank of the chain key whose MAC the row carries for ``seq`` (0: the current)."""
        return self.keys.signer(_canonical(row, seq), row.row_hash)

    def sealed(self, row: AuditEvent, seq: int | None = None) -> bool:
        """Whether the row's MAC is right for ``seq`` under the current or an earlier key."""
        return self.signer(row, seq) is not None

    def head_mac(self, head: Head) -> str:
        return self.keys.mac(head.canonical())

    def payload_of(self, row: AuditEvent) -> dict:
        return json.loads(self.cipher.decrypt(row.payload_enc, TABLE, "payload_enc", row.seq))

    # -- appending -----------------------------------------------------------------------------
    def append(self, session: Session, event_type: str, *, actor: str, outcome: str = "ok",
               payload: dict | None = None, request_id: str | None = None,
               fingerprint: str | None = None) -> AuditEvent:
        """Add one event at the chain's end, inside the caller's transaction."""
        return self.append_many(session, [Event(event_type, actor, outcome, payload, request_id, fingerprint)])[0]

    def append_many(self, session: Session | Connection, events: list[Event]) -> list[EventRow]:
        """Add events at the chain's end in their order, inside the caller's transaction.

        Three statements however many events (the callback's group commit writes one per
        message), on the driver's cursor (``app.outbox.statements``): move the head's seq past them all,
        which locks the head row until commit (PostgreSQL's row lock; SQLite's one write lock),
        insert the sealed rows, and move the head's hash and MAC. The first append under a new
        SECRET_KEY writes the chain-key ``key_rotation`` event first (one statement more).
        Returns what was written (the caller's events).
        """
        for event in events:
            if event.event_type not in EventType.ALL:
                raise ValueError(f"unknown audit event type {event.event_type!r}")
        if not events:
            return []
        sql = DriverStatements(session)
        [(last_seq, prev_hash, anchor_seq, anchor_hash, key_id)] = sql.execute(
            "UPDATE audit_chain SET last_seq = last_seq + ? WHERE id = 1 "
            "RETURNING last_seq, last_hash, anchor_seq, anchor_hash, key_id", (len(events),))
        rotation = self._rotation(key_id, last_seq - len(events))
        if rotation is not None:
            [(last_seq,)] = sql.execute(
                "UPDATE audit_chain SET last_seq = last_seq + 1 WHERE id = 1 RETURNING last_seq")
            events = [rotation, *events]
        rows, now = [], utcnow()
        for seq, event in enumerate(events, start=last_seq - len(events) + 1):
            row = EventRow(
                seq=seq, created_at=now, event_type=event.event_type, actor=event.actor[:80],
                outcome=event.outcome[:16], request_id=event.request_id, fingerprint=event.fingerprint,
                payload_enc=self.cipher.encrypt(
                    json.dumps(event.payload or {}, ensure_ascii=False, sort_keys=True, default=str),
                    TABLE, "payload_enc", seq),
                prev_hash=prev_hash,
            )
            row.row_hash = prev_hash = self.seal(row)
            rows.append(row)
        stored_at = sql.time(now)
        sql.executemany(_INSERT_EVENT, [(
            row.seq, stored_at, row.event_type, row.actor, row.outcome, row.request_id, row.fingerprint,
            row.payload_enc, row.prev_hash, row.row_hash) for row in rows])
        head = Head(last_seq, prev_hash, anchor_seq, anchor_hash, self.keys.current_id, now)
        sql.execute("UPDATE audit_chain SET last_hash = ?, updated_at = ?, key_id = ?, head_mac = ? "
                    "WHERE id = 1", (prev_hash, stored_at, head.key_id, self.head_mac(head)))
        return rows[1:] if rotation is not None else rows

    def _rotation(self, head_key_id: str | None, before_seq: int) -> Event | None:
        """The chain-key rotation event to write first, when the head was sealed under another
        key (or, upgraded from before head MACs, under none) and the chain has rows."""
        if head_key_id == self.keys.current_id or (head_key_id is None and before_seq == 0):
            return None
        return Event(EventType.KEY_ROTATION, "system", payload={
            "chain_key": self.keys.current_id, "previous_chain_key": head_key_id})

    def record(self, db, event_type: str, **kwargs) -> AuditEvent:
        """Append in a transaction of its own (worker events, CLI commands)."""
        with db.transaction() as session:
            row = self.append(session, event_type, **kwargs)
        self.publish_head(db)
        return row

    def checkpoint(self, db, outage: str | None = None, actor: str = "system") -> int:
        """Write an ``audit_checkpoint`` event (the beat, every AUDIT_CHECKPOINT_MINUTES): it
        reseals the head, so a head replayed from before a cut tail looks stale, and its time
        in the chain makes a cut show as a gap. ``outage``: why the events stopped before this
        one (signs the gap off). Its seq."""
        payload = {"interval_minutes": self.checkpoint_minutes, **({"outage": outage} if outage else {})}
        with db.transaction() as session:
            row = self.append(session, EventType.AUDIT_CHECKPOINT, actor=actor, payload=payload)
        self.publish_head(db)
        return row.seq

    def publish_head(self, db, resealed: bool = False) -> None:
        """Copy the committed head outside the database (when AUDIT_HEAD_FILE is set).

        A copy that cannot be written is logged, not raised: the event is committed already,
        and a caller that retried on the error would write it twice; ``verify`` reports the
        copy as missing or behind. ``resealed``: the chain was re-linked with the key (a
        SECRET_KEY or data key rotation verified it first), so the copy's row hash changed
        honestly and the copy follows."""
        if self.head_file is None:
            return
        with db.reader() as session:
            head = Head.of(session.get(AuditChain, 1, populate_existing=True))

            def stored_hash(seq: int) -> str | None:
                return session.scalar(select(AuditEvent.row_hash).where(AuditEvent.seq == seq))

            try:
                outcome = self.head_file.write(head, None if resealed else stored_hash)
            except OSError as exc:
                log.warning("audit head copy not written to %s: %s", self.head_file.path, exc)
                return
        if outcome == FORKED:
            log.error("audit head copy at %s names a row the chain no longer holds (cut and "
                      "appended to since?): kept as evidence, not overwritten; run 'audit verify'",
                      self.head_file.path)

    def head_moved(self, db) -> None:
        """``publish_head`` soon, in a thread of this process (``Coalesced``): for writers
        whose commits are many and latency-bound (the callbacks' group commit). Without it the
        copy lagged the chain by every callback since the last checkpoint, and a tail cut back
        into that lag, under an old head put back, showed nowhere."""
        if self.head_file is None:
            return
        if self._copier is None:
            self._copier = Coalesced(lambda: self.publish_head(db))
        self._copier.poke()

    # -- verifying -----------------------------------------------------------------------------
    def check(self, db, now: datetime | None = None) -> VerifyReport:
        """``verify`` in a reader session of its own, on one snapshot (PostgreSQL: REPEATABLE
        READ, so appends committed meanwhile do not look like rows past the head)."""
        with snapshot(db) as session:
            return self.verify(session, now=now)

    def verify(self, session: Session, batch: int = 2000, now: datetime | None = None) -> VerifyReport:
        """Walk the chain and name every changed, inserted, deleted or reordered row, every
        broken link, retired key, unsealed/stale head and unrecorded purge."""
        head = session.get(AuditChain, 1, populate_existing=True)
        if head is None:  # appends fail without it; say so rather than walk nothing
            return VerifyReport(issues=[Issue("head", 0, "the chain head row (audit_chain id 1) is missing")])
        report = VerifyReport(anchor_seq=head.anchor_seq)
        checks = ChainChecks(self.keys, self.payload_of, Issue)
        span = max(head.last_seq - head.anchor_seq, 0)
        seen = bytearray(span)  # which written seqs (anchor+1 .. last) we found
        forged: list[AuditEvent] = []
        moves: list[tuple[int, int]] = []
        after = -1
        while True:
            rows = list(session.scalars(select(AuditEvent).where(AuditEvent.seq > after)
                                        .order_by(AuditEvent.seq).limit(batch)))
            if not rows:
                break
            for row in rows:
                report.rows += 1
                report.first_seq = row.seq if report.first_seq is None else report.first_seq
                report.last_seq = row.seq
                rank = self.signer(row)
                written = row.seq if rank is not None else self._moved_from(session, row)
                if written is None:
                    forged.append(row)
                    continue
                if rank is not None:
                    checks.row(row, rank)
                else:
                    moves.append((row.seq, written))
                self._mark(report, seen, head, written, row)
            after = rows[-1].seq
            for row in rows:
                session.expunge(row)  # keep memory flat on long chains

        for row in forged:
            kind = self._forged_kind(session, row, head)
            if kind == "changed":
                report.issues.append(Issue("changed", row.seq, "contents do not match its hash"))
                self._mark(report, seen, head, row.seq, None)
            else:
                report.issues.append(Issue("inserted", row.seq, "not written by the audit log"))
        report.issues += _move_issues(moves)
        report.issues += _missing_issues(seen, head.anchor_seq)
        self._check_ends(session, head, report)
        checks.head(Head.of(head), head.head_mac, now or utcnow(), self._max_head_age())
        report.issues += checks.issues
        report.issues += self._check_copy(session, head, now or utcnow())
        report.issues.sort(key=lambda issue: (issue.seq, issue.kind))
        return report

    def _max_head_age(self) -> timedelta | None:
        if self.stale_minutes:
            return timedelta(minutes=self.stale_minutes)
        return timedelta(minutes=2 * self.checkpoint_minutes) if self.checkpoint_minutes else None

    def _moved_from(self, session: Session, row: AuditEvent) -> int | None:
        """The other seq a row that does not verify at its own was sealed at; None (forged)."""
        candidates = list(range(max(row.seq - MOVE_SEARCH, 1), row.seq + MOVE_SEARCH + 1))
        predecessor = session.scalar(select(AuditEvent.seq).where(AuditEvent.row_hash == row.prev_hash))
        if predecessor is not None:
            candidates.insert(0, predecessor + 1)
        for seq in candidates:
            if seq != row.seq and self.sealed(row, seq):
                return seq
        return None

    @staticmethod
    def _mark(report: VerifyReport, seen: bytearray, head: AuditChain, written: int, row) -> None:
        index = written - head.anchor_seq - 1
        if 0 <= index < len(seen):
            if seen[index]:
                report.issues.append(Issue("inserted", row.seq if row else written,
                                           f"a second copy of seq {written}"))
            seen[index] = 1
        elif row is not None:
            where = "before the purge anchor" if written <= head.anchor_seq else "after the chain head"
            report.issues.append(Issue("inserted", row.seq, where))

    @staticmethod
    def _forged_kind(session: Session, row: AuditEvent, head: AuditChain) -> str:
        if row.seq > head.last_seq or row.seq <= head.anchor_seq:
            return "inserted"
        successor = session.get(AuditEvent, row.seq + 1)
        if successor is not None and successor.prev_hash == row.row_hash:
            return "changed"
        before = session.get(AuditEvent, row.seq - 1)
        before_hash = before.row_hash if before is not None else (
            head.anchor_hash if row.seq == head.anchor_seq + 1 else None)
        links_past = successor is not None and successor.prev_hash == before_hash
        at_end = successor is None and head.last_hash == before_hash
        return "inserted" if links_past or at_end else "changed"

    def _check_ends(self, session: Session, head: AuditChain, report: VerifyReport) -> None:
        """The chain's two ends against the head: the first row links to the anchor, the head
        names the last row (the head's MAC only says the head is ours, not that it fits)."""
        first = session.get(AuditEvent, head.anchor_seq + 1)
        if first is not None and first.prev_hash != head.anchor_hash and self._intact(first):
            report.issues.append(Issue("anchor", first.seq, "does not link to the purge anchor"))
        last = session.get(AuditEvent, head.last_seq) if head.last_seq > head.anchor_seq else None
        if last is not None and last.row_hash != head.last_hash and self._intact(last):
            report.issues.append(Issue("head", head.last_seq, "the chain head names another row"))

    def _intact(self, row: AuditEvent) -> bool:
        return self.sealed(row)

    def _check_copy(self, session: Session, head: AuditChain, now: datetime) -> list[Issue]:
        """The head against its copy outside the database: the copy may lag, never lead, and
        not for longer than the stale limit."""
        if self.head_file is None:
            return []
        path = self.head_file.path
        try:
            copy = self.head_file.read()
        except ValueError as exc:
            return [Issue("external", head.last_seq, str(exc))]
        if copy is None:
            return [Issue("external", head.last_seq, f"no head copy at {path} (never written, or removed)")]
        if copy.last_seq > head.last_seq:
            return [Issue("external", copy.last_seq, f"the head copy at {path} names seq "
                          f"{copy.last_seq} (sealed {copy.sealed_at}); the chain ends at "
                          f"{head.last_seq}: its newest events were cut off")]
        if copy.last_seq > head.anchor_seq:
            stored = session.scalar(select(AuditEvent.row_hash).where(AuditEvent.seq == copy.last_seq))
            if stored != copy.last_hash:
                return [Issue("external", copy.last_seq, f"the head copy at {path} names another "
                              f"row at seq {copy.last_seq}: the chain was rewritten from there")]
        max_age = self._max_head_age()
        if max_age is not None and copy.last_seq < head.last_seq:
            try:
                age = now - datetime.fromisoformat(copy.sealed_at)
            except (TypeError, ValueError):
                return [Issue("external", copy.last_seq, f"the head copy at {path} has no valid time")]
            if age > max_age:
                return [Issue("external", copy.last_seq, f"the head copy at {path} is {_minutes(age)} "
                              f"old and behind the chain (seq {copy.last_seq} of {head.last_seq}), "
                              f"past the stale limit of {_minutes(max_age)}: copies stopped (can "
                              "the services write the file?)")]
        return []

    # -- retention -----------------------------------------------------------------------------
    def purge(self, db, retention_days: int, now: datetime | None = None) -> int:
        """Delete the events older than the retention; the chain then starts at a new anchor,
        which a sealed ``audit_purge`` event records.

        Refuses a broken chain: anchoring on a tampered row would launder the tampering. The
        chain is verified *outside* the chain lock (appends go on meanwhile); the lock is then
        held only to check that the new anchor row and the old anchor are still what was
        verified, delete, move the anchor and append the purge event.
        """
        if retention_days < MIN_RETENTION_DAYS:
            raise ValueError(f"retention must be at least {MIN_RETENTION_DAYS} days")
        cutoff = (now or utcnow()) - timedelta(days=retention_days)
        with snapshot(db) as session:
            last = session.scalar(select(func.max(AuditEvent.seq)).where(AuditEvent.created_at < cutoff))
            if last is None:
                return 0
            report = self.verify(session, now=now)
            if not report.ok:
                raise ChainBroken(report)
            anchor_hash = session.scalar(select(AuditEvent.row_hash).where(AuditEvent.seq == last))
            verified = session.get(AuditChain, 1)
            old_anchor = (verified.anchor_seq, verified.anchor_hash)
        with db.transaction() as session:
            head = lock_head(session)
            if (head.anchor_seq, head.anchor_hash) != old_anchor:
                log.info("audit purge: another purge moved the anchor meanwhile; nothing done")
                return 0
            now_hash = session.scalar(select(AuditEvent.row_hash).where(AuditEvent.seq == last))
            if now_hash != anchor_hash:
                raise ChainBroken(VerifyReport(anchor_seq=head.anchor_seq, issues=[
                    Issue("changed", last, "changed while the purge verified the chain")]))
            deleted = session.execute(delete(AuditEvent).where(AuditEvent.seq <= last)).rowcount
            session.execute(update(AuditChain).where(AuditChain.id == 1)
                            .values(anchor_seq=last, anchor_hash=anchor_hash)
                            .execution_options(synchronize_session=False))
            self.append(session, EventType.AUDIT_PURGE, actor="system", payload={
                "through_seq": last, "anchor_hash": anchor_hash, "deleted": deleted,
                "retention_days": retention_days, "cutoff": cutoff.astimezone(UTC).isoformat()})
        self.publish_head(db)
        log.info("audit purge: %d events up to seq %d (older than %s)", deleted, last, cutoff)
        return deleted

    # -- key rotation ----------------------------------------------------------------------------
    def reseal_with_primary_key(self, session: Session) -> int:
        """Re-encrypt payloads sealed with old key ids and re-link the chain from there on; rows
        sealed under an earlier SECRET_KEY are re-sealed under the current one the same way.

        The hash covers the ciphertext, so a new ciphertext means new hashes for that row and
        every later one. It runs in one transaction under the head lock (appenders wait), and
        only on a chain that verifies first, so rotation cannot hide earlier tampering.
        """
        head = lock_head(session)
        report = self.verify(session)
        if not report.ok:
            raise ChainBroken(report)
        head = session.get(AuditChain, 1, populate_existing=True)
        prev, rotated, after = head.anchor_hash, 0, head.anchor_seq
        relinking = False
        while True:
            rows = list(session.scalars(select(AuditEvent).where(AuditEvent.seq > after)
                                        .order_by(AuditEvent.seq).limit(1000)))
            if not rows:
                break
            for row in rows:
                if self.cipher.needs_rotation(row.payload_enc):
                    plain = self.cipher.decrypt_bytes(row.payload_enc, TABLE, "payload_enc", row.seq)
                    row.payload_enc = self.cipher.encrypt(plain, TABLE, "payload_enc", row.seq)
                    rotated += 1
                    relinking = True
                elif not relinking and self.signer(row) != 0:
                    relinking = True  # sealed under an earlier SECRET_KEY: re-seal from here on
                if relinking:
                    row.prev_hash = prev
                    row.row_hash = self.seal(row)
                prev = row.row_hash
            after = rows[-1].seq
            session.flush()
        # key_id stays the key of the last append: when that was an earlier SECRET_KEY, the
        # next append (keys rotate's own event) still writes the chain-key rotation event, so
        # the earlier key stops being good for the rows after it.
        head.last_hash, head.updated_at = prev, utcnow()
        head.head_mac = self.head_mac(Head.of(head))
        session.flush()
        return rotated


def _canonical(row, seq: int | None) -> bytes:
    fields = [
        "audit-v1", row.seq if seq is None else seq,
        row.created_at.astimezone(UTC).isoformat(timespec="microseconds"),
        row.event_type, row.actor, row.outcome, row.request_id or "", row.fingerprint or "",
        row.payload_enc, row.prev_hash,
    ]
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


@contextmanager
def snapshot(db):
    """A reader session that sees one snapshot of the database for all its statements."""
    with db.reader() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        yield session


_EVENT_COLUMNS = ("seq", "created_at", "event_type", "actor", "outcome", "request_id", "fingerprint",
                  "payload_enc", "prev_hash", "row_hash")
_INSERT_EVENT = (f"INSERT INTO {TABLE} ({', '.join(_EVENT_COLUMNS)}) "  # noqa: S608 - constants only
                 f"VALUES ({', '.join('?' * len(_EVENT_COLUMNS))})")


def lock_head(session: Session) -> AuditChain:
    """Take the chain's lock for the rest of the caller's transaction and return the head."""
    if session.get_bind().dialect.name == "sqlite":
        # A write first: SQLite's one write lock, held to commit (as BEGIN IMMEDIATE would).
        session.execute(update(AuditChain).where(AuditChain.id == 1)
                        .values(updated_at=AuditChain.updated_at)
                        .execution_options(synchronize_session=False))
        return session.scalars(select(AuditChain).where(AuditChain.id == 1)
                               .execution_options(populate_existing=True)).one()
    return session.scalars(select(AuditChain).where(AuditChain.id == 1).with_for_update()
                           .execution_options(populate_existing=True)).one()


def _move_issues(moves: list[tuple[int, int]]) -> list[Issue]:
    """Rows sealed at another seq; a run shifted by the same offset is one issue."""
    issues: list[Issue] = []
    run: list[tuple[int, int]] = []
    for at, written in [*moves, (None, None)]:
        if run and (at is None or at != run[-1][0] + 1 or at - written != run[0][0] - run[0][1]):
            (a, wa), (b, wb) = run[0], run[-1]
            detail = (f"written as seq {wa}" if a == b
                      else f"seq {a}..{b} were written as {wa}..{wb}")
            issues.append(Issue("reordered", a, detail))
            run = []
        if at is not None:
            run.append((at, written))
    return issues


def _missing_issues(seen: bytearray, anchor_seq: int) -> list[Issue]:
    issues, start = [], None
    for index in range(len(seen) + 1):
        missing = index < len(seen) and not seen[index]
        if missing and start is None:
            start = index
        elif not missing and start is not None:
            a, b = anchor_seq + start + 1, anchor_seq + index
            issues.append(Issue("deleted", a, "missing" if a == b else f"seq {a}..{b} missing"))
            start = None
    return issues


def _minutes(delta: timedelta) -> str:
    return f"{int(delta.total_seconds() // 60)} min"
