"""Re-encrypt every sealed column with the primary key (``flask keys rotate``).

Walks ``app.models.ENCRYPTED_COLUMNS`` in primary-key batches, one transaction per batch; a value
is rewritten with a compare-and-set on the old ciphertext, so a row a worker changed meanwhile is
left for the next run instead of being overwritten. The audit log is special: its hashes cover the
ciphertext, so ``AuditLog.reseal_with_primary_key`` re-encrypts and re-links it under the chain
lock. The run itself is audited as a ``key_rotation`` event (counts and key ids, no values).
"""

from __future__ import annotations

from sqlalchemy import and_, or_, select, update

from app.audit.chain import EventType
from app.db import Base
from app.models import ENCRYPTED_COLUMNS, AuditEvent
from app.tools import models as _tool_models  # noqa: F401 - its sealed column joins ENCRYPTED_COLUMNS


def rotate_keys(services, batch_size: int = 500, actor: str = "cli") -> dict[str, int]:
    cipher = services.cipher
    prefix = f"v1:{cipher.primary_id}:"
    counts: dict[str, int] = {}
    for table_name, (pk_name, columns) in ENCRYPTED_COLUMNS.items():
        if table_name == AuditEvent.__tablename__:
            continue
        table = Base.metadata.tables[table_name]
        pk = table.c[pk_name]
        old = or_(*[and_(table.c[c].is_not(None), ~table.c[c].startswith(prefix, autoescape=True))
                    for c in columns])
        after = None
        while True:
            with services.db.transaction() as session:
                query = select(pk, *[table.c[c] for c in columns]).where(old)
                if after is not None:
                    query = query.where(pk > after)
                rows = session.execute(query.order_by(pk).limit(batch_size)).all()
                for row in rows:
                    for name in columns:
                        value = getattr(row, name)
                        if value is None or value.startswith(prefix):
                            continue
                        fresh = cipher.encrypt(cipher.decrypt_bytes(value, table_name, name, row[0]),
                                               table_name, name, row[0])
                        done = session.execute(update(table).where(pk == row[0], table.c[name] == value)
                                               .values({name: fresh})).rowcount
                        counts[f"{table_name}.{name}"] = counts.get(f"{table_name}.{name}", 0) + done
            if len(rows) < batch_size:
                break
            after = rows[-1][0]
    with services.db.transaction() as session:
        counts["audit_events.payload_enc"] = services.audit.reseal_with_primary_key(session)
        services.audit.append(session, EventType.KEY_ROTATION, actor=actor, outcome="ok",
                              payload={"primary_key_id": cipher.primary_id, "rewritten": counts})
    services.audit.publish_head(services.db, resealed=True)  # the re-linked rows' new hashes
    return counts
