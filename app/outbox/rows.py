"""The outbox: every accepted WeCom message is a row here until it is answered.

The callback accepts messages (``prepare`` on the request thread, then ``accept_many`` in the group
commit of ``app.intake``: the rows, encrypted, status ``queued``); the worker ``claim``s one with a lease (a compare-and-set on status,
so two deliveries of the same task never both run it, and a dead worker's lease simply expires),
and the sweeper re-enqueues rows that nobody is working on. A user's messages are claimed strictly in arrival order.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace

from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from app.db import UTCDateTime, utcnow
from app.models import Budget, InboundMessage, MessageStatus
from app.outbox.statements import DriverStatements, read_time, statements_of, values_rows
from app.security import BlindIndex, FieldCipher

TABLE = InboundMessage.__tablename__


@dataclass(frozen=True)
class Accepted:
    id: int
    created: bool
    stream_id: str | None = None  # the AI bot channel's stream (the first delivery's, on a retry)


def user_hash(blind_index: BlindIndex, user_id: str) -> str:
    return blind_index("wecom-user", user_id)


@dataclass(frozen=True)
class Arrival:
    """A message to accept, with where it came from."""

    message: object
    request_id: str | None = None
    channel: str = "app"
    stream_id: str | None = None  # the AI bot channel's new stream
    enqueue: bool = True  # the intake publishes the new row's task (the AI bot channel does it itself)


@dataclass(frozen=True, slots=True)
class Prepared:
    """An arrival reduced to the values its write needs: the hashes and the payload's JSON are
    worked out on the request thread, so the writer (a thread of this process, or the intake
    server: ``app.web.intake_server``) does little but the transaction. Plain values, in the order
    ``to_wire`` sends them; ``user`` and ``payload`` are the plaintexts that the writer seals
    with the new row's id."""

    dedup_hash: str
    channel: str
    agent_id: int | None
    user_hash: str
    msg_type: str
    event: str | None
    create_time: int
    request_id: str | None
    stream_id: str | None
    user: str
    payload: str
    fingerprint: str | None = None
    enqueue: bool = True
    # The dedup hash under BLIND_INDEX_KEY's older keys (none unless the ring has them): a retry
    # of a message accepted before a new key led the ring is still found.
    older_dedup_hashes: tuple[str, ...] = ()

    def to_wire(self) -> list:
        return [getattr(self, name) for name in self.__slots__]

    @classmethod
    def from_wire(cls, values: list) -> Prepared:
        """The inverse of ``to_wire``; a ``TypeError``/``ValueError`` names what does not fit."""
        if not isinstance(values, list) or len(values) != len(cls.__slots__):
            raise ValueError("not a prepared arrival")
        prepared = cls(*values)
        for name in ("dedup_hash", "channel", "user_hash", "msg_type", "user", "payload"):
            if not isinstance(getattr(prepared, name), str):
                raise TypeError(f"{name} is not a string")
        if type(prepared.create_time) is not int:
            raise TypeError("create_time is not an integer")
        if not isinstance(prepared.older_dedup_hashes, list | tuple) or not all(
                isinstance(h, str) for h in prepared.older_dedup_hashes):
            raise TypeError("older_dedup_hashes is not a list of strings")
        return prepared


def prepare(blind_index: BlindIndex, arrival: Arrival, fingerprint: str | None = None) -> Prepared:
    m = arrival.message
    dedup, *older = blind_index.candidates("wecom-dedup", f"{arrival.channel}:{m.dedup_key}")
    return Prepared(
        dedup, arrival.channel, m.agent_id,
        user_hash(blind_index, m.from_user), m.msg_type, m.event, int(m.create_time),
        arrival.request_id, arrival.stream_id, m.from_user,
        json.dumps(_payload_of(m), ensure_ascii=False, default=str), fingerprint, arrival.enqueue,
        tuple(older))


def accept_many(session: Session | Connection, cipher: FieldCipher, arrivals: list[Prepared]) -> list[Accepted]:
    """Insert the messages as queued rows, in order, or find the rows WeCom's retries duplicate.

    The caller owns the transaction. ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` on the
    unique dedup hash makes concurrent deliveries of one message race safely to a single row
    (a retry within the same batch included), and what it returns names the rows this call
    created; the encrypted fields follow in an UPDATE because their associated data binds the
    row id the INSERT made. One statement each for the whole batch, on the driver's cursor
    (``app.outbox.statements``): this is the callback's hot path.
    """
    if not arrivals:
        return []
    sql = DriverStatements(session)
    now = sql.time(utcnow())
    earlier = _found_under_older_keys(sql, arrivals)
    values = []
    for a in arrivals:
        if a.dedup_hash not in earlier:
            values += (a.dedup_hash, a.channel, a.agent_id, a.user_hash, a.msg_type, a.event,
                       a.create_time, a.request_id, a.stream_id, MessageStatus.QUEUED, 0, 0, now, now, now)
    rows = len(values) // len(_INSERT_COLUMNS)
    created = dict(sql.execute(_insert_sql(rows), values)) if rows else {}
    missing = list({a.dedup_hash for a in arrivals
                    if a.dedup_hash not in created and a.dedup_hash not in earlier})
    existing = dict(earlier)
    if missing:
        existing.update({dedup: (row_id, stream_id)
                         for dedup, row_id, stream_id in sql.execute(_find_sql(len(missing)), missing)})
    results, seals, first_stream = [], [], {}
    for a in arrivals:
        row_id = created.get(a.dedup_hash)
        if row_id is None:  # a retry of a message accepted before
            known_id, known_stream = existing[a.dedup_hash]
            results.append(Accepted(known_id, False, known_stream))
            continue
        if a.dedup_hash in first_stream:  # a retry of a message earlier in this batch
            results.append(Accepted(row_id, False, first_stream[a.dedup_hash]))
            continue
        first_stream[a.dedup_hash] = a.stream_id
        seals.append((cipher.encrypt(a.user, TABLE, "user_enc", row_id),
                      cipher.encrypt(a.payload, TABLE, "payload_enc", row_id), row_id))
        results.append(Accepted(row_id, True, a.stream_id))
    sql.executemany(_SEAL, seals)
    return results


def _found_under_older_keys(sql: DriverStatements, arrivals: list[Prepared]) -> dict[str, tuple]:
    """{current dedup hash: (row id, stream id)} of the arrivals stored under an older key."""
    older = {h: a.dedup_hash for a in arrivals for h in a.older_dedup_hashes}
    if not older:
        return {}
    return {older[dedup]: (row_id, stream_id)
            for dedup, row_id, stream_id in sql.execute(_find_sql(len(older)), list(older))}


_INSERT_COLUMNS = ("dedup_hash", "channel", "agent_id", "user_hash", "msg_type", "event",
                   "wecom_create_time", "request_id", "stream_id", "status", "attempts", "chunks_sent",
                   "created_at", "updated_at", "enqueued_at")
_SEAL = f"UPDATE {TABLE} SET user_enc = ?, payload_enc = ? WHERE id = ?"  # noqa: S608 - constants only


@functools.lru_cache(maxsize=128)
def _insert_sql(rows: int) -> str:
    return (f"INSERT INTO {TABLE} ({', '.join(_INSERT_COLUMNS)}) VALUES "  # noqa: S608 - constants only
            f"{values_rows(rows, len(_INSERT_COLUMNS))} ON CONFLICT (dedup_hash) DO NOTHING RETURNING dedup_hash, id")


@functools.lru_cache(maxsize=128)
def _find_sql(hashes: int) -> str:
    return f"SELECT dedup_hash, id, stream_id FROM {TABLE} WHERE dedup_hash IN ({', '.join('?' * hashes)})"  # noqa: S608


def _payload_of(message) -> dict:
    """The message's fields but the two user ids (``user_enc`` holds the sender's)."""
    if dataclasses.is_dataclass(message):
        data = {name: getattr(message, name) for name in _field_names(type(message))}
    else:
        data = dict(vars(message))
    for public in ("to_user", "from_user"):
        data.pop(public, None)
    return data


@functools.cache
def _field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


# -- the worker's side ---------------------------------------------------------------------------
class ClaimResult:
    CLAIMED = "claimed"
    DONE = "done"              # already answered/failed/ignored: nothing to do
    WAIT_EARLIER = "wait"      # an earlier message of the same user is still pending
    LEASED = "leased"          # another worker holds a live lease
    MISSING = "missing"


@dataclass
class Claim:
    result: str
    row: ClaimedRow | None = None  # the claimed row (CLAIMED only)
    retry_after_s: float = 0.0


_COLUMNS = tuple(InboundMessage.__table__.c.keys())
_TIMES = frozenset(c.name for c in InboundMessage.__table__.c if isinstance(c.type, UTCDateTime))


@functools.cache
def _claim_sql() -> str:
    """The claim's UPDATE as plain SQL on the driver's cursor (``DriverStatements``; through
    Core, its compiled-cache lookup, parameters and the result's type processing for every
    column cost the worker more CPU than the database spent running it): the row is queued (or
    its lease ran out) and no earlier message of the same user is still pending. It returns the
    row's columns, and ``budgeted``: whether any budget is enabled at all. Without one the worker
    admits the call without a reservation, as ``Accounting.reserve`` would, instead of a group
    commit that reads the budgets to find none, and its settle reads none either (a budget
    enabled after the claim applies from the next message claimed)."""
    queued, processing = MessageStatus.QUEUED, MessageStatus.PROCESSING
    return (
        f"UPDATE {TABLE} SET status = '{processing}', lease_owner = ?, lease_until = ?, "  # noqa: S608
        f"attempts = attempts + 1, updated_at = ? "
        f"WHERE id = ? AND (status = '{queued}' OR (status = '{processing}' "
        f"AND (lease_until IS NULL OR lease_until < ?))) "
        f"AND NOT EXISTS (SELECT 1 FROM {TABLE} AS earlier WHERE earlier.user_hash = {TABLE}.user_hash "
        f"AND earlier.id < {TABLE}.id AND earlier.status IN ('{queued}', '{processing}')) "
        f"RETURNING {', '.join(_COLUMNS)}, "
        f"EXISTS (SELECT 1 FROM {Budget.__tablename__} WHERE enabled = TRUE)")


def _claimed_row(values: tuple) -> ClaimedRow:
    """The claim's returned row as ``UTCDateTime`` and the ORM would read it (SQLite's cursor
    gives the stored text of a time, PostgreSQL's an aware value)."""
    row = dict(zip(_COLUMNS, values, strict=False))
    for name in _TIMES:
        row[name] = read_time(row[name])
    row["budgeted"] = bool(values[len(_COLUMNS)])
    return ClaimedRow(**row)


class ClaimedRow(SimpleNamespace):
    """The claimed row: ``InboundMessage``'s columns as attributes, read and updated in memory by
    the worker (its writes go through ``save_progress``/``finish``), never an ORM object."""


def claim(bind: Session | DriverStatements, message_id: int, owner: str, lease_s: float) -> Claim:
    """Take the row for ``owner`` until ``now + lease_s``, or say why not."""
    now = utcnow()
    sql = statements_of(bind)
    # RETURNING hands back the claimed row with the UPDATE: no second statement, and on SQLite
    # no second write transaction (a read after the commit began one, with its writer turn).
    claimed = sql.execute(_claim_sql(), [owner, sql.time(now + timedelta(seconds=lease_s)), sql.time(now),
                                         message_id, sql.time(now)])
    if claimed:
        sql.commit()
        return Claim(ClaimResult.CLAIMED, _claimed_row(claimed[0]))
    # Why not: the two columns that say, not the whole row as an ORM object (a drained message's
    # own task lands here, so this is about every other claim after a burst).
    found = sql.execute(f"SELECT status, lease_until FROM {TABLE} WHERE id = ?", [message_id])  # noqa: S608
    sql.commit()
    if not found:
        return Claim(ClaimResult.MISSING)
    status, lease_until = found[0][0], read_time(found[0][1])
    if status in MessageStatus.FINAL:
        return Claim(ClaimResult.DONE)
    if status == MessageStatus.PROCESSING and lease_until and lease_until >= now:
        return Claim(ClaimResult.LEASED, retry_after_s=(lease_until - now).total_seconds() + 0.2)
    return Claim(ClaimResult.WAIT_EARLIER, retry_after_s=0.5)


def renew_lease(bind: Session | DriverStatements, message_id: int, owner: str, lease_s: float) -> bool:
    """Extend our lease; False means we lost it (another worker took the row)."""
    sql = statements_of(bind)
    renewed = sql.count(f"UPDATE {TABLE} SET lease_until = ? WHERE id = ? AND lease_owner = ? "  # noqa: S608
                        f"AND status = '{MessageStatus.PROCESSING}'",
                        [sql.time(utcnow() + timedelta(seconds=lease_s)), message_id, owner])
    sql.commit()
    return renewed == 1


@functools.lru_cache(maxsize=64)
def _leased_update_sql(columns: tuple[str, ...], with_next: bool = False) -> str:
    """``UPDATE`` of our leased row (id, owner, still processing) setting ``columns``, as plain
    SQL on the driver's cursor (``DriverStatements``): the worker runs two of these a message
    (the stored reply, the finish), and through Core each cost about 0.1 ms more CPU in the
    statement's compiled-cache lookup, parameter processing and result wrapping. ``with_next``:
    it also returns the id of the user's next queued message (``next_pending_of_user``'s query,
    as a subquery; its parameters follow the row's)."""
    unknown = set(columns) - set(_COLUMNS)
    if unknown:
        raise ValueError(f"not columns of {TABLE}: {sorted(unknown)}")
    sql = (f"UPDATE {TABLE} SET {', '.join(f'{name} = ?' for name in columns)} "  # noqa: S608 - column names checked
           f"WHERE id = ? AND lease_owner = ? AND status = '{MessageStatus.PROCESSING}'")
    if with_next:
        sql += (f" RETURNING (SELECT later.id FROM {TABLE} AS later WHERE later.user_hash = ? "  # noqa: S608
                f"AND later.id > ? AND later.status = '{MessageStatus.QUEUED}' "
                "ORDER BY later.id LIMIT 1)")
    return sql


def _leased_params(sql: DriverStatements, message_id: int, owner: str, values: dict) -> tuple[tuple, list]:
    columns = tuple(sorted(values))
    bound = [sql.time(v) if isinstance(v, datetime) else v for v in (values[c] for c in columns)]
    return columns, [*bound, message_id, owner]


def _update_leased(bind: Session | DriverStatements, message_id: int, owner: str, values: dict) -> bool:
    sql = statements_of(bind)
    columns, params = _leased_params(sql, message_id, owner, values)
    updated = sql.count(_leased_update_sql(columns), params)
    sql.commit()
    return updated == 1


def _finish_values(status: str, values: dict) -> dict:
    now = utcnow()
    if status == MessageStatus.ANSWERED:
        values.setdefault("answered_at", now)
    return {"status": status, "lease_owner": None, "lease_until": None, "updated_at": now, **values}


def finish(bind: Session | DriverStatements, message_id: int, owner: str, status: str, **values) -> bool:
    """Move our claimed row to a final status (or back to ``queued``) and drop the lease."""
    return _update_leased(bind, message_id, owner, _finish_values(status, values))


def finish_then_next(bind: Session | DriverStatements, message_id: int, owner: str, status: str,
                     user_hash_value: str, **values) -> tuple[bool, int | None]:
    """``finish``, and in the same statement the user's next queued message after this one (what
    ``next_pending_of_user`` reads): (finished, its id or None). One round trip and one
    transaction fewer for the worker's drain (``worker.processor``) than reading it after."""
    sql = statements_of(bind)
    columns, params = _leased_params(sql, message_id, owner, _finish_values(status, values))
    returned = sql.execute(_leased_update_sql(columns, with_next=True), [*params, user_hash_value, message_id])
    sql.commit()
    if not returned:
        return False, None
    return True, returned[0][0]


def save_progress(bind: Session | DriverStatements, message_id: int, owner: str, **values) -> bool:
    """Record part of the work (the reply, a sent chunk) while we hold the lease."""
    return _update_leased(bind, message_id, owner, {"updated_at": utcnow(), **values})


def by_stream_id(session: Session, stream_id: str) -> InboundMessage | None:
    return session.scalar(select(InboundMessage).where(InboundMessage.stream_id == stream_id))


def _next_queued(rows_, user_hash_value, after_id):
    """The user's first queued message after ``after_id`` (the worker's drain takes it next):
    read alone (``next_pending_of_user``) or returned by the finish (``finish_then_next``)."""
    return (select(rows_.c.id)
            .where(rows_.c.user_hash == user_hash_value, rows_.c.id > after_id,
                   rows_.c.status == MessageStatus.QUEUED)
            .order_by(rows_.c.id).limit(1))


@functools.cache
def _next_pending_statement():
    return _next_queued(InboundMessage.__table__, bindparam("user_hash"), bindparam("after_id"))


def next_pending_of_user(session: Session, user_hash_value: str, after_id: int) -> int | None:
    return session.scalar(_next_pending_statement(), {"user_hash": user_hash_value, "after_id": after_id})


def stale_rows(session: Session, queued_before: datetime, limit: int = 500) -> list[int]:
    """Rows nobody is working on: queued for too long, or processing with an expired lease."""
    now = utcnow()
    return list(session.scalars(
        select(InboundMessage.id)
        .where(or_(
            and_(InboundMessage.status == MessageStatus.QUEUED,
                 or_(InboundMessage.enqueued_at.is_(None), InboundMessage.enqueued_at < queued_before)),
            and_(InboundMessage.status == MessageStatus.PROCESSING, InboundMessage.lease_until < now),
        ))
        .order_by(InboundMessage.id).limit(limit)
    ))


def mark_enqueued(session: Session, ids: list[int]) -> None:
    if ids:
        session.execute(update(InboundMessage).where(InboundMessage.id.in_(ids))
                        .values(enqueued_at=utcnow()).execution_options(synchronize_session=False))
        session.commit()
