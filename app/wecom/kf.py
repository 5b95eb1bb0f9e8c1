"""微信客服 (kf) API: read customers' messages, answer them, hand them to a person.

The request and answer shapes are WeCom's (客服消息 / 会话分配与变更, doc 94670 and its siblings):

- ``kf/sync_msg`` {cursor, token, limit, open_kfid} -> {next_cursor, has_more, msg_list: [{msgid,
  open_kfid, external_userid, send_time, origin (3 customer, 4 system event, 5 servicer),
  msgtype, text: {content}, event: {...}}]}; the callback's ``token`` makes it cheap for 10
  minutes, without one WeCom rate-limits it hard;
- ``kf/send_msg`` {touser, open_kfid, msgid?, msgtype, text: {content}} -> {msgid}: allowed
  within 48 hours of the customer's last message, at most 5 messages per customer message;
  ``msgid`` is ours to choose, and WeCom refuses a second message with one it already has;
- ``kf/service_state/get`` {open_kfid, external_userid} -> {service_state, servicer_userid};
- ``kf/service_state/trans`` {open_kfid, external_userid, service_state, servicer_userid?}.

Service states: 0 new, 1 the bot (智能助手), 2 waiting in the queue, 3 a person (人工接待), 4 ended.
"""

from __future__ import annotations

from dataclasses import dataclass

#: message origins in sync_msg's msg_list
ORIGIN_CUSTOMER, ORIGIN_EVENT, ORIGIN_SERVICER = 3, 4, 5
#: session states (service_state)
NEW, BOT, QUEUED, HUMAN, ENDED = 0, 1, 2, 3, 4
#: WeCom's answers for a send outside its rules (the window, 5 a message, the session's state)
SEND_REFUSED = (95001, 95018)
DUPLICATE_MSGID = 95017
TEXT_LIMIT = 2048  # bytes of one text message's content


@dataclass(frozen=True)
class SyncPage:
    next_cursor: str
    has_more: bool
    messages: list[dict]


class KfApi:
    """The kf area over a ``WeComClient`` (its token, retries and error mapping)."""

    def __init__(self, client):
        self.client = client

    def sync_msg(self, open_kfid: str, cursor: str = "", token: str = "", limit: int = 1000) -> SyncPage:
        body = {"open_kfid": open_kfid, "limit": limit}
        if cursor:
            body["cursor"] = cursor
        if token:
            body["token"] = token
        data = self.client.post("/cgi-bin/kf/sync_msg", body)
        messages = data.get("msg_list") or []
        return SyncPage(str(data.get("next_cursor") or cursor), bool(data.get("has_more")),
                        [m for m in messages if isinstance(m, dict)])

    def send_text(self, open_kfid: str, external_userid: str, content: str, msgid: str) -> dict:
        return self.client.post("/cgi-bin/kf/send_msg", {
            "touser": external_userid, "open_kfid": open_kfid, "msgid": msgid,
            "msgtype": "text", "text": {"content": content}})

    def service_state(self, open_kfid: str, external_userid: str) -> tuple[int, str]:
        data = self.client.post("/cgi-bin/kf/service_state/get",
                                {"open_kfid": open_kfid, "external_userid": external_userid})
        return int(data.get("service_state", NEW)), str(data.get("servicer_userid") or "")

    def transfer(self, open_kfid: str, external_userid: str, state: int,
                 servicer_userid: str | None = None) -> dict:
        body = {"open_kfid": open_kfid, "external_userid": external_userid, "service_state": state}
        if servicer_userid:
            body["servicer_userid"] = servicer_userid
        return self.client.post("/cgi-bin/kf/service_state/trans", body)
