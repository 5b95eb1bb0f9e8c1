"""``kf_msg_or_event`` -> outbox rows: read a kf account's new messages once, whoever reads.

The callback's event is an outbox row like any message (accepted before WeCom hears 200, its
task retried, swept when lost). Its task calls ``sync_account``, which reads pages from the
account's stored cursor and, for each page, in ONE transaction:

1. moves the cursor from the value it read to the page's ``next_cursor`` (a compare-and-set:
   a second worker that read the same page finds the cursor moved, writes nothing and reads on
   from the new cursor);
2. writes the page's customer messages as outbox rows (unique on WeCom's msgid: a page read
   again after a crash between WeCom's answer and the commit is the same rows) with their
   ``message_received`` audit events.

So a worker killed anywhere leaves either the old cursor and no rows (the page is read again)
or the new cursor and every row (their tasks are published after the commit, or by the
sweeper). Each customer message is then answered by the ordinary worker path, exactly once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import bindparam, text

from app.db import UTCDateTime, utcnow
from app.intake.local import new_tasks, received_event
from app.kf.messages import CHANNEL, customer_message
from app.models import KfCursor
from app.outbox.publisher import publish_tasks
from app.outbox.rows import Arrival, accept_many, prepare
from app.wecom.exceptions import WeComAPIError
from app.wecom.kf import KfApi

log = logging.getLogger(__name__)
TABLE = KfCursor.__tablename__
MAX_PAGES = 50  # a backlog beyond this many pages is left for the next event (WeCom sends one)
EXPIRED_TOKEN = (95007, 95008)  # the callback's token is invalid or past its 10 minutes

_READ = text(f"SELECT cursor FROM {TABLE} WHERE open_kfid = :account")  # noqa: S608 - constant
_CREATE = text(f"INSERT INTO {TABLE} (open_kfid, cursor, synced, updated_at) "  # noqa: S608
               "VALUES (:account, :new, :taken, :now) ON CONFLICT (open_kfid) DO NOTHING"
               ).bindparams(bindparam("now", type_=UTCDateTime))
_MOVE = text(f"UPDATE {TABLE} SET cursor = :new, synced = synced + :taken, updated_at = :now "  # noqa: S608
             "WHERE open_kfid = :account AND cursor = :old").bindparams(bindparam("now", type_=UTCDateTime))


class _CursorMoved(Exception):
    """Another reader took this page first: the transaction is rolled back."""


@dataclass
class SyncResult:
    pages: int = 0
    taken: int = 0  # customer messages written as new rows
    lost_races: int = 0  # pages another reader had taken first


def read_cursor(db, open_kfid: str) -> str | None:
    """The stored cursor, or None before the account's first page."""
    with db.engine.connect() as conn:
        return conn.execute(_READ, {"account": open_kfid}).scalar()


def sync_account(services, api: KfApi, open_kfid: str, token: str = "") -> SyncResult:
    """Read ``open_kfid``'s messages up to the newest and write the customers' to the outbox."""
    result = SyncResult()
    for _ in range(MAX_PAGES):
        cursor = read_cursor(services.db, open_kfid)
        try:
            page = api.sync_msg(open_kfid, cursor or "", token, services.settings.kf_sync_limit)
        except WeComAPIError as exc:
            if token and exc.errcode in EXPIRED_TOKEN:
                token = ""  # a retried task outlived the callback's token: read without it
                continue
            raise
        result.pages += 1
        created = _take_page(services, open_kfid, cursor, page)
        if created is None:
            result.lost_races += 1
            continue
        result.taken += len(created)
        if created:
            publish_tasks(services.publisher, created)
        if not page.has_more:
            break
    log.info("kf sync pages=%d taken=%d lost_races=%d", result.pages, result.taken, result.lost_races)
    return result


def _take_page(services, open_kfid: str, cursor: str | None, page) -> list[tuple[int, None]] | None:
    """Write the page and move the cursor in one transaction: the new rows' (id, request id),
    or None when another reader moved the cursor first (nothing written)."""
    corp_id = services.settings.wecom_corp_id
    messages = [m for m in (customer_message(item, corp_id) for item in page.messages) if m is not None]
    prepared = [prepare(services.blind_index, Arrival(m, channel=CHANNEL)) for m in messages]
    params = {"account": open_kfid, "new": page.next_cursor, "taken": len(prepared), "now": utcnow()}
    try:
        with services.db.engine.begin() as conn:
            if cursor is None:
                moved = conn.execute(_CREATE, params).rowcount
            else:
                moved = conn.execute(_MOVE, {**params, "old": cursor}).rowcount
            if moved != 1:
                raise _CursorMoved()
            accepted = accept_many(conn, services.cipher, prepared)
            services.audit.append_many(conn, [received_event(p, a)
                                              for p, a in zip(prepared, accepted, strict=True) if a.created])
    except _CursorMoved:
        return None
    if prepared:
        services.audit.head_moved(services.db)
    return new_tasks(prepared, accepted)
