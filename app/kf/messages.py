"""A customer's message read from kf/sync_msg, in the shape the outbox accepts (``Message``).

The customer (``kf:`` + ``external_userid``) stands where an employee's user id stands: sealed
in the row's ``user_enc``, hashed in ``user_hash``, never in a log. The kf account (``open_kfid``) and
WeCom's ``msgid`` ride in the sealed payload: the reply goes back to that account, and the
msgid keys the row, so a message read twice (a page read again after a crash) is one row.
A customer's text is ``text``; anything else is ``kf_<type>``, which the worker answers with
the "text only" notice (kf media are not fetched).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.wecom.kf import ORIGIN_CUSTOMER
from app.wecom.messages import Message

CHANNEL = "kf"
#: A customer's id as the outbox holds it: apart from every employee's user id, so that no
#: employee's hash (their user budget, rate limit, conversation, files) is ever a customer's.
CUSTOMER_PREFIX = "kf:"


def external_userid(user_id: str) -> str:
    """WeCom's ``external_userid`` of a kf row's (decrypted) user."""
    return user_id.removeprefix(CUSTOMER_PREFIX)


@dataclass(frozen=True, slots=True, kw_only=True)
class KfCustomerMessage(Message):
    open_kfid: str
    content: str = ""
    send_time: int = 0

    @property
    def dedup_key(self) -> str:
        return f"msg:{self.msg_id}"


def customer_message(item: dict, corp_id: str) -> KfCustomerMessage | None:
    """The outbox's message for one ``msg_list`` item, or None for what is not a customer's
    (a servicer's reply, a system event) or is malformed."""
    if item.get("origin") != ORIGIN_CUSTOMER:
        return None
    msgid, customer, account = item.get("msgid"), item.get("external_userid"), item.get("open_kfid")
    if not all(isinstance(v, str) and v for v in (msgid, customer, account)):
        return None
    kind = item.get("msgtype") if isinstance(item.get("msgtype"), str) else "unknown"
    text = item.get("text") if isinstance(item.get("text"), dict) else {}
    send_time = item.get("send_time") if isinstance(item.get("send_time"), int) else 0
    return KfCustomerMessage(
        to_user=corp_id, from_user=CUSTOMER_PREFIX + customer, create_time=send_time, agent_id=None, msg_id=msgid,
        msg_type="text" if kind == "text" else f"kf_{kind}"[:16], open_kfid=account,
        content=str(text.get("content") or "") if kind == "text" else "", send_time=send_time)
