"""The stored cursors (``siem_cursors``): how far each sink has taken each stream.

In the database rather than Redis: a cursor lost is either everything sent again (six months
of audit events, at least) or a gap, and Redis here may run without persistence or lose its
last second of writes; the database keeps the cursor beside the events it points into, so a
restore from a backup rolls both back together. One row write per batch is nothing to it.

A cursor only moves forward, by a compare-and-set on the position the batch was read after:
two exporters that raced (a lock lost to a Redis restart) cannot move it backwards or count a
batch twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite

from app.db import utcnow
from app.models import SiemCursor


@dataclass(frozen=True)
class Cursor:
    sink: str
    stream: str
    position: int
    exported: int
    clear_fields: str | None
    last_error: str | None


def load(db, sink: str, stream: str) -> Cursor:
    """The cursor, created at 0 (the start of what is kept) the first time a sink runs."""
    with db.transaction() as session:
        insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
        session.execute(insert(SiemCursor)
                        .values(sink=sink, stream=stream, position=0, exported=0, updated_at=utcnow())
                        .on_conflict_do_nothing(index_elements=["sink", "stream"]))
        row = session.scalars(select(SiemCursor).where(SiemCursor.sink == sink,
                                                       SiemCursor.stream == stream)).one()
        return Cursor(row.sink, row.stream, row.position, row.exported, row.clear_fields,
                      row.last_error)


def advance(db, sink: str, stream: str, old: int, new: int, sent: int) -> bool:
    """Move the cursor from ``old`` to ``new`` after the receiver took ``sent`` events; False
    when it is no longer at ``old`` (another exporter moved it meanwhile)."""
    with db.transaction() as session:
        result = session.execute(
            update(SiemCursor).where(SiemCursor.sink == sink, SiemCursor.stream == stream,
                                     SiemCursor.position == old)
            .values(position=new, exported=SiemCursor.exported + sent, updated_at=utcnow(),
                    last_error=None)
            .execution_options(synchronize_session=False))
        return result.rowcount == 1


def note(db, sink: str, stream: str, *, error: str | None = None,
         clear_fields: str | None = None) -> None:
    """Record why the last run stopped (None: it did not), or the payload policy exported under."""
    values: dict = {"updated_at": utcnow(), "last_error": (error or None) and error[:200]}
    if clear_fields is not None:
        values["clear_fields"] = clear_fields
    with db.transaction() as session:
        session.execute(update(SiemCursor).where(SiemCursor.sink == sink, SiemCursor.stream == stream)
                        .values(**values).execution_options(synchronize_session=False))


def all_cursors(db) -> list[Cursor]:
    with db.reader() as session:
        return [Cursor(r.sink, r.stream, r.position, r.exported, r.clear_fields, r.last_error)
                for r in session.scalars(select(SiemCursor).order_by(SiemCursor.sink, SiemCursor.stream))]
