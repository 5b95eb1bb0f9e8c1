"""What ``AuditLog.verify`` checks beyond each row's own MAC: links, keys, the head, the anchor.

Fed the rows sealed at their own seq, in seq order, it checks that:

- each row links to the row before it (``prev_hash``): a row edited and re-sealed with some
  key still breaks the link to its successor;
- no row is sealed with a key retired by an earlier ``key_rotation`` event of the chain key
  (``app.audit.keys``: an old ``SECRET_KEY`` is good only for rows before its rotation);
- the head carries a MAC, under a key not retired by then, and was sealed recently enough
  (checkpoints reseal it every ``AUDIT_CHECKPOINT_MINUTES``; a head older than twice that is a
  replayed old head over a cut tail, or checkpoints that stopped);
- from the first ``audit_checkpoint`` on, no two consecutive events lie further apart than
  twice the interval the last checkpoint recorded (**gap**): the staleness of the head lasts
  only until the next append reseals it, a gap stays in the chain. A real outage of everything
  (no checkpoint, no traffic) is signed off by a checkpoint with ``outage`` (``audit checkpoint
  --outage REASON``, sealed with the key, so not by someone who only writes the database);
- the purge anchor is the one the newest sealed ``audit_purge`` event names (genesis before any
  purge): a purge done by hand, without its event, shows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from app.audit.head import Head
from app.audit.keys import ChainKeys

GENESIS = "0" * 64
KEY_ROTATION, AUDIT_PURGE, AUDIT_CHECKPOINT = "key_rotation", "audit_purge", "audit_checkpoint"


class ChainChecks:
    def __init__(self, keys: ChainKeys, payload_of: Callable, issue: Callable):
        self.keys = keys
        self._payload_of = payload_of
        self._issue = issue  # Issue's constructor (kind, seq, detail)
        self.issues: list = []
        self.allowed_rank = keys.oldest_rank  # before any rotation event: any key of the ring
        self.rotated_at: int | None = None
        self.previous: tuple[int, str] | None = None
        self.purge: tuple[int, dict] | None = None
        self.newest: tuple[int, datetime] | None = None  # the latest event time seen, its seq
        self.max_gap: timedelta | None = None  # from the first checkpoint on

    def row(self, row, rank: int) -> None:
        """A row whose MAC holds at its own seq under the key of ``rank``, in seq order."""
        self._key(row.seq, rank, "sealed")
        if self.previous is not None and self.previous[0] == row.seq - 1 \
                and row.prev_hash != self.previous[1]:
            self._add("link", row.seq, f"does not link to seq {row.seq - 1} (re-sealed after a change?)")
        self.previous = (row.seq, row.row_hash)
        payload = self._payload(row) if row.event_type in (KEY_ROTATION, AUDIT_PURGE, AUDIT_CHECKPOINT) else {}
        self._gap(row, payload)
        if row.event_type == KEY_ROTATION and "chain_key" in payload:
            self.allowed_rank, self.rotated_at = self.keys.rank(payload["chain_key"]), row.seq
        elif row.event_type == AUDIT_PURGE:
            self.purge = (row.seq, payload)
        elif row.event_type == AUDIT_CHECKPOINT:
            minutes = payload.get("interval_minutes") or 0
            self.max_gap = timedelta(minutes=2 * minutes) if minutes else None

    def _gap(self, row, payload: dict) -> None:
        if self.newest is not None and self.max_gap is not None:
            seq, at = self.newest
            gap = row.created_at - at
            if gap > self.max_gap and not payload.get("outage"):
                self._add("gap", row.seq, f"{_hours(gap)} without any event since seq {seq}, though "
                          f"checkpoints should have written one every {_hours(self.max_gap / 2)}: "
                          "events cut out, or everything stopped (a real outage: audit checkpoint "
                          "--outage REASON)")
        if self.newest is None or row.created_at > self.newest[1]:
            self.newest = (row.seq, row.created_at)

    def head(self, head: Head, mac: str | None, now: datetime, max_age: timedelta | None) -> None:
        if mac is None:
            self._add("head", head.last_seq, "the chain head is not sealed: no event was ever "
                      "written, or the head was reset")
        else:
            rank = self.keys.signer(head.canonical(), mac)
            if rank is None:
                self._add("head", head.last_seq, "the chain head's MAC does not verify: moved, "
                          "reset or re-anchored without the chain key")
            else:
                self._key(head.last_seq, rank, "the chain head is sealed")
                age = now - head.sealed_at
                if max_age is not None and age > max_age:
                    self._add("stale", head.last_seq, f"the chain head was last sealed "
                              f"{_hours(age)} ago, past the stale limit of {_hours(max_age)} "
                              "(AUDIT_STALE_MINUTES; checkpoints reseal it): an old head put back "
                              "over cut events, or checkpoints stopped")
        self._anchor(head)

    def _anchor(self, head: Head) -> None:
        if head.anchor_seq == 0:
            if head.anchor_hash != GENESIS:
                self._add("purge", 0, "an anchor hash without any purge")
            return
        if self.purge is None:
            self._add("purge", head.anchor_seq, "the chain starts after a purge no sealed "
                      "audit_purge event records")
            return
        seq, payload = self.purge
        if (payload.get("through_seq"), payload.get("anchor_hash")) != (head.anchor_seq, head.anchor_hash):
            self._add("purge", head.anchor_seq, f"the anchor is not the one the newest purge "
                      f"event (seq {seq}) records (through seq {payload.get('through_seq')})")

    def _key(self, seq: int, rank: int, what: str) -> None:
        if rank > self.allowed_rank:
            self._add("key", seq, f"{what} with a chain key retired at seq {self.rotated_at}")

    def _payload(self, row) -> dict:
        try:
            payload = self._payload_of(row)
            return payload if isinstance(payload, dict) else {}
        except Exception:  # noqa: BLE001 - a sealed row whose payload does not open is reported
            self._add("payload", row.seq, "sealed, but its payload does not decrypt (a data key missing?)")
            return {}

    def _add(self, kind: str, seq: int, detail: str) -> None:
        self.issues.append(self._issue(kind, seq, detail))


def _hours(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
