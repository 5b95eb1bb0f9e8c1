"""Move every stored blind index and API-key digest to BLIND_INDEX_KEY's current key
(``keys rotate-index``), after which the older keys can be removed from the ring.

An HMAC cannot be re-keyed from itself, so each index is re-computed from its plaintext, which
the database keeps sealed (DATA_KEYS): a message's sender (``user_enc``) and payload give its
``user_hash`` and ``dedup_hash``; an API key's sealed SHA-256 (``key_seal``) gives its digest.
A value is rewritten only when its old digest is one of the ring's digests of that plaintext
(so a plaintext reconstructed wrongly is never written), with a compare-and-set on the old
value. The users' old -> current digests, learned from the messages, then move ``usage_records``,
``usage_daily`` (rows that meet their current twin are added into it), user budgets and the
feedback rows (``answer_ratings``, ``feedback_comments``).

Batched (one transaction per batch), idempotent (a value already current is left as it is) and
resumable (a rerun learns the users again from the messages, all already current). What cannot
be moved is counted, never guessed: digests of users with no message left, API keys made before
migration 0009 and unused since (no seal yet). Audit events keep their actor as sealed into the
chain. The run is audited as a ``key_rotation`` event (counts only).
"""

from __future__ import annotations

import json
from collections import Counter

from sqlalchemy import select, update

from app.audit.chain import EventType
from app.models import (
    AnswerRating,
    ApiKey,
    Budget,
    BudgetScope,
    FeedbackComment,
    InboundMessage,
    UsageDaily,
    UsageRecord,
)
from app.outbox.rows import TABLE as INBOUND

SUMMED = ("calls", "prompt_tokens", "cached_tokens", "completion_tokens", "cost")


def dedup_key(channel: str, user: str, payload: dict) -> str:
    """``Message.dedup_key`` again, from the sealed sender and payload (app/wecom)."""
    if channel != "aibot" and payload.get("msg_type") == "event":
        return f"evt:{user}:{payload.get('create_time')}:{payload.get('event')}"
    return f"msg:{payload.get('msg_id')}"


def rotate_index(services, batch_size: int = 500, actor: str = "cli") -> dict[str, int]:
    counts: Counter[str] = Counter()
    users = _messages(services, batch_size, counts)
    _usage(services, users, batch_size, counts)
    _api_keys(services, batch_size, counts)
    counts["users_known"] = len(set(users.values()))
    result = {name: count for name, count in counts.items() if count}
    with services.db.transaction() as session:
        services.audit.append(session, EventType.KEY_ROTATION, actor=actor, outcome="ok",
                              payload={"blind_index_keys": services.blind_index.key_count,
                                       "rewritten": result})
    return result


def _messages(services, batch_size: int, counts: Counter) -> dict[str, str]:
    """Re-index inbound_messages; {a user's digest under each key: the current one}."""
    bi, cipher = services.blind_index, services.cipher
    users: dict[str, str] = {}
    after = 0
    while True:
        with services.db.transaction() as session:
            rows = session.execute(
                select(InboundMessage.id, InboundMessage.channel, InboundMessage.user_hash,
                       InboundMessage.dedup_hash, InboundMessage.user_enc, InboundMessage.payload_enc)
                .where(InboundMessage.id > after).order_by(InboundMessage.id).limit(batch_size)).all()
            changes = []
            for row in rows:
                if row.user_enc is None:
                    counts["inbound_messages.no_plaintext"] += 1
                    continue
                user = cipher.decrypt(row.user_enc, INBOUND, "user_enc", row.id)
                hashes = bi.candidates("wecom-user", user)
                users.update(dict.fromkeys(hashes, hashes[0]))
                values = {}
                if row.user_hash != hashes[0]:
                    if row.user_hash in hashes:
                        values["user_hash"] = hashes[0]
                    else:
                        counts["inbound_messages.user_hash_unmatched"] += 1
                payload = (json.loads(cipher.decrypt(row.payload_enc, INBOUND, "payload_enc", row.id))
                           if row.payload_enc else {})
                dedups = bi.candidates("wecom-dedup", f"{row.channel}:{dedup_key(row.channel, user, payload)}")
                if row.dedup_hash != dedups[0]:
                    if row.dedup_hash in dedups:
                        values["dedup_hash"] = dedups[0]
                    else:
                        counts["inbound_messages.dedup_hash_unmatched"] += 1
                if values:
                    changes.append((row, values))
            wanted = [v["dedup_hash"] for _, v in changes if "dedup_hash" in v]
            taken = set(session.scalars(select(InboundMessage.dedup_hash).where(
                InboundMessage.dedup_hash.in_(wanted)))) if wanted else set()
            for row, values in changes:
                if values.get("dedup_hash") in taken:  # a retry stored twice across the key change
                    del values["dedup_hash"]
                    counts["inbound_messages.dedup_hash_duplicate"] += 1
                if not values:
                    continue
                done = session.execute(update(InboundMessage).where(
                    InboundMessage.id == row.id, InboundMessage.user_hash == row.user_hash,
                    InboundMessage.dedup_hash == row.dedup_hash).values(values)).rowcount
                for name in values:
                    counts[f"inbound_messages.{name}"] += done
        if len(rows) < batch_size:
            return users
        after = rows[-1].id


def _usage(services, users: dict[str, str], batch_size: int, counts: Counter) -> None:
    """Move usage rows and user budgets from the users' older digests to their current one."""
    moves = [(old, new) for old, new in users.items() if old != new]
    for start in range(0, len(moves), batch_size):
        with services.db.transaction() as session:
            for old, new in moves[start:start + batch_size]:
                counts["usage_records.user_hash"] += session.execute(
                    update(UsageRecord).where(UsageRecord.user_hash == old)
                    .values(user_hash=new)).rowcount
                for table in (AnswerRating, FeedbackComment):  # app.feedback.ratings's rows
                    moved = session.execute(
                        update(table).where(table.user_hash == old).values(user_hash=new)).rowcount
                    if moved:
                        counts[f"{table.__tablename__}.user_hash"] += moved
                for row in session.scalars(select(UsageDaily).where(UsageDaily.user_hash == old)).all():
                    twin = session.get(UsageDaily, (row.day, row.department, new, row.model))
                    if twin is None:
                        session.add(UsageDaily(day=row.day, department=row.department, user_hash=new,
                                               model=row.model, **{c: getattr(row, c) for c in SUMMED}))
                    else:
                        for column in SUMMED:
                            setattr(twin, column, getattr(twin, column) + getattr(row, column))
                    session.delete(row)
                    session.flush()
                    counts["usage_daily.user_hash"] += 1
                for budget in session.scalars(select(Budget).where(
                        Budget.scope == BudgetScope.USER, Budget.scope_value == old)).all():
                    if session.scalar(select(Budget.id).where(
                            Budget.scope == BudgetScope.USER, Budget.scope_value == new,
                            Budget.period == budget.period)) is not None:
                        counts["budgets.duplicate_left"] += 1  # an admin set it again meanwhile
                        continue
                    budget.scope_value = new
                    counts["budgets.scope_value"] += 1
    known = set(users)
    with services.db.reader() as session:
        left = set(session.scalars(select(UsageDaily.user_hash).distinct()))
        left |= set(session.scalars(select(Budget.scope_value).where(Budget.scope == BudgetScope.USER)))
    counts["users_without_messages"] = len({h for h in left - known if not h.startswith("api_key:")})


def _api_keys(services, batch_size: int, counts: Counter) -> None:
    bi, cipher = services.blind_index, services.cipher
    after = 0
    while True:
        with services.db.transaction() as session:
            rows = session.execute(select(ApiKey.id, ApiKey.key_hash, ApiKey.key_seal)
                                   .where(ApiKey.id > after).order_by(ApiKey.id).limit(batch_size)).all()
            for row in rows:
                if row.key_seal is None:
                    counts["api_keys.unsealed_left"] += 1
                    continue
                digests = bi.candidates("api-key", cipher.decrypt(row.key_seal, ApiKey.__tablename__,
                                                                  "key_seal", row.id))
                if row.key_hash == digests[0]:
                    continue
                if row.key_hash not in digests:
                    counts["api_keys.unmatched"] += 1
                    continue
                counts["api_keys.key_hash"] += session.execute(update(ApiKey).where(
                    ApiKey.id == row.id, ApiKey.key_hash == row.key_hash)
                    .values(key_hash=digests[0])).rowcount
        if len(rows) < batch_size:
            return
        after = rows[-1].id
