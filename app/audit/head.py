"""The audit chain's head: its MAC, and its copy outside the database.

The head row (``audit_chain`` id 1) says where the chain ends (``last_seq``/``last_hash``), where
it starts after purges (``anchor_seq``/``anchor_hash``), which key sealed it and when. Its MAC
(``head_mac``) covers all of that, so moving the head to a truncated tail, resetting it, or
moving the anchor without a purge needs the chain key. What the MAC cannot stop is a *replayed*
head (an old head row, MAC and all, put back after cutting the rows written since): the
``sealed_at`` time (checkpoints reseal the head periodically; ``verify`` reports a head older
than expected) and the copy outside the database (``HeadFile``) catch that.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)
WRITTEN, BEHIND, FORKED = "written", "behind", "forked"


@dataclass(frozen=True)
class Head:
    last_seq: int
    last_hash: str
    anchor_seq: int
    anchor_hash: str
    key_id: str | None
    sealed_at: datetime

    @classmethod
    def of(cls, row) -> Head:
        """From an ``AuditChain`` row."""
        return cls(row.last_seq, row.last_hash, row.anchor_seq, row.anchor_hash, row.key_id,
                   row.updated_at)

    def canonical(self) -> bytes:
        fields = ["audit-head-v1", self.last_seq, self.last_hash, self.anchor_seq, self.anchor_hash,
                  self.key_id or "", self.sealed_at.astimezone(UTC).isoformat(timespec="microseconds")]
        return json.dumps(fields, separators=(",", ":")).encode()


@dataclass(frozen=True)
class HeadCopy:
    """What the outside copy holds: enough to find the row it names."""

    last_seq: int
    last_hash: str
    anchor_seq: int
    sealed_at: str


class HeadFile:
    """A file outside the database holding the newest head seen (``AUDIT_HEAD_FILE``).

    Written after commit (a checkpoint, a purge, an event recorded in its own transaction, the
    accounting writer's batch of reply events) by
    a write to a temporary file and a rename, so a reader sees the old copy or the new one. It
    never moves backwards: processes that commit in one order may write in another, so a copy
    older than the one there is dropped. Hence a copy may lag the database (appends inside
    callers' transactions do not write it), never lead it: ``verify`` accepts a copy behind
    the head whose row is still in the chain, and reports one ahead of it or naming another row.
    Put it where the database's users cannot write (another host's mount, a WORM bucket synced
    from it).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def read(self) -> HeadCopy | None:
        try:
            data = json.loads(self.path.read_text())
            return HeadCopy(int(data["last_seq"]), str(data["last_hash"]), int(data["anchor_seq"]),
                            str(data["sealed_at"]))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ValueError(f"{self.path} cannot be read: {exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{self.path} is not a head copy: {exc}") from None

    def write(self, head: Head, stored_hash: Callable[[int], str | None] | None = None) -> str:
        """Replace the copy with ``head`` unless the copy there is newer (``BEHIND``) or names
        a row the chain no longer holds (``FORKED``); ``WRITTEN`` when written.

        ``stored_hash(seq)``: the chain's row hash at ``seq`` now (None: purged or absent). An
        old head put back over a cut tail, then appended to, reuses the cut seqs: overwriting
        the copy would hide the cut for good, so a copy whose row was replaced is kept, as the
        evidence ``verify`` reports."""
        copy = HeadCopy(head.last_seq, head.last_hash, head.anchor_seq,
                        head.sealed_at.astimezone(UTC).isoformat(timespec="microseconds"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                there = self.read()
            except ValueError:
                there = None
            if there is not None and there.last_seq > copy.last_seq:
                return BEHIND
            if there is not None and stored_hash is not None and there.last_seq > head.anchor_seq \
                    and stored_hash(there.last_seq) != there.last_hash:
                return FORKED
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as out:
                    json.dump(asdict(copy), out)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return WRITTEN


class Coalesced:
    """Runs ``publish`` in a thread of its own soon after ``poke``, at most once every
    ``min_interval_s``: many commits (the callbacks' group commit, a batch every few ms under
    load) cost one copy of the head, and no committing thread waits for the file's fsync.

    The thread starts on the first poke in each process (a forked web worker gets its own)."""

    def __init__(self, publish: Callable[[], None], min_interval_s: float = 0.5):
        self._publish = publish
        self.min_interval_s = min_interval_s
        self._poked = threading.Event()
        self._pid: int | None = None
        self._lock = threading.Lock()

    def poke(self) -> None:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._poked = threading.Event()
                    threading.Thread(target=self._run, args=(self._poked,), name="audit-head-copy",
                                     daemon=True).start()
                    self._pid = os.getpid()
        self._poked.set()

    def _run(self, poked: threading.Event) -> None:
        while True:
            poked.wait()
            poked.clear()
            try:
                self._publish()
            except Exception:  # noqa: BLE001 - 'audit verify' reports a copy behind the chain
                log.exception("the audit head was not copied out")
            threading.Event().wait(self.min_interval_s)
