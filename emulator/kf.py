"""微信客服 (kf) as WeCom runs it, for the demo and the tests.

A customer on WeChat writes (``POST /_emulator/kf/send``): the message joins the account's log,
and WeCom calls the app's callback URL with ``kf_msg_or_event`` (Token, OpenKfId; no user, no
message) and its retries. The app then reads with ``/cgi-bin/kf/sync_msg`` from its cursor
(an opaque position in the account's log; the same cursor always gives the same page), answers
with ``kf/send_msg`` and hands over with ``kf/service_state/trans``. WeCom's rules are kept:

- send_msg: only within 48 hours of the customer's last message and at most 5 messages per
  customer message (95001), only while the bot may write: state 0 or 1 (95018); a msgid already
  used is refused (95017);
- service_state/trans: 0/1 -> 1, 2, 3, 4; 2 -> 3, 4; 3 -> 4 (else 95016); state 3 names a servicer;
- a callback token lives 10 minutes (95007 after, or when unknown); sync without one is allowed.

``/kf/`` is a customer's chat page; ``/_emulator/kf/messages`` lists what the customer received, ``/_emulator/kf/sessions`` the
session states, ``/_emulator/kf/end`` is the servicer ending a session (state 4).
"""

from __future__ import annotations

import json
import secrets
import threading
import time

from flask import Blueprint, current_app, jsonify, render_template, request

from emulator.api import answer, error
from emulator.api import state as emulator_state
from emulator.callbacks import cdata

bp = Blueprint("wecom_kf", __name__)
DEFAULT_ACCOUNT = "wkEmulatorKf000001"
WINDOW_S = 48 * 3600
MAX_PER_MESSAGE = 5
TOKEN_TTL_S = 600
TRANSITIONS = {0: {1, 2, 3, 4}, 1: {1, 2, 3, 4}, 2: {3, 4}, 3: {4}, 4: set()}
ERRMSG = {95000: "invalid open_kfid", 95001: "send msg count limit or out of 48 hours window",
          95007: "invalid msg token", 95016: "invalid service state transition",
          95017: "duplicate msgid", 95018: "service state does not allow the api to send"}


class KfState:
    """The accounts' logs, the sessions and what the bot sent, behind one lock."""

    def __init__(self, wall=time.time):
        self.wall = wall
        self.lock = threading.RLock()
        self.accounts: dict[str, list[dict]] = {DEFAULT_ACCOUNT: []}
        self.sessions: dict[tuple[str, str], dict] = {}
        self.sent: list[dict] = []
        self.msgids: set[str] = set()
        self.tokens: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def bump(self, name: str) -> None:
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + 1

    def session(self, account: str, customer: str) -> dict:
        return self.sessions.setdefault((account, customer), {
            "state": 0, "servicer_userid": "", "last_customer_time": 0, "sent_since": 0})

    def customer_writes(self, account: str, customer: str, content: str, send_time: int | None) -> dict:
        with self.lock:
            at = int(send_time if send_time is not None else self.wall())
            item = {"msgid": secrets.token_hex(16), "open_kfid": account, "external_userid": customer,
                    "send_time": at, "origin": 3, "msgtype": "text", "text": {"content": content}}
            self.accounts.setdefault(account, []).append(item)
            session = self.session(account, customer)
            if session["state"] == 4:
                session.update(state=0, servicer_userid="")
            session["last_customer_time"] = max(session["last_customer_time"], at)
            session["sent_since"] = 0
            token = "ENC" + secrets.token_urlsafe(24)
            self.tokens[token] = self.wall() + TOKEN_TTL_S
            return {"msgid": item["msgid"], "token": token, "send_time": at}

    def page(self, account: str, cursor: str, limit: int) -> dict:
        with self.lock:
            log = self.accounts[account]
            start = int(cursor[1:]) if cursor.startswith("c") and cursor[1:].isdigit() else 0
            items = log[start:start + limit]
            end = start + len(items)
            return {"next_cursor": f"c{end}", "has_more": 1 if end < len(log) else 0,
                    "msg_list": [dict(i) for i in items]}


def kf_state() -> KfState:
    return current_app.extensions["wecom_emulator_kf"]


def _body() -> dict | None:
    try:
        body = json.loads(request.get_data() or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def _kf_error(code: int) -> dict:
    return error(code, ERRMSG.get(code))


def _checked(handle):
    """Token and body checks every kf API shares, then ``handle(body, kf)``."""
    def run() -> dict:
        code = emulator_state().check_token(request.args.get("access_token"))
        if code:
            return error(code)
        body = _body()
        if body is None:
            return error(47001)
        kf = kf_state()
        if body.get("open_kfid") not in kf.accounts:
            return _kf_error(95000)
        with kf.lock:
            return handle(body, kf)
    return run


@bp.post("/cgi-bin/kf/sync_msg")
def sync_msg():
    def handle(body: dict, kf: KfState) -> dict:
        token = body.get("token")
        if token:
            expires = kf.tokens.get(token)
            if expires is None or expires < kf.wall():
                return _kf_error(95007)
        else:
            kf.bump("sync_without_token")
        limit = body.get("limit", 1000)
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            return error(47001)
        kf.bump("sync_msg")
        return error(0, **kf.page(body["open_kfid"], str(body.get("cursor") or ""), limit))
    return answer("kf/sync_msg", _checked(handle))


@bp.post("/cgi-bin/kf/send_msg")
def send_msg():
    def handle(body: dict, kf: KfState) -> dict:
        customer, msgtype = body.get("touser"), body.get("msgtype")
        text = body.get("text") if isinstance(body.get("text"), dict) else {}
        content = text.get("content")
        if not isinstance(customer, str) or not customer or msgtype != "text":
            return error(40008 if customer else 41009)
        if not isinstance(content, str) or not content.strip():
            return error(44004)
        if len(content.encode()) > 2048:
            return error(45002)
        msgid = body.get("msgid") or secrets.token_hex(16)
        if msgid in kf.msgids:
            kf.bump("duplicate_msgid")
            return _kf_error(95017)
        session = kf.session(body["open_kfid"], customer)
        if session["state"] not in (0, 1):
            kf.bump("refused_state")
            return _kf_error(95018)
        if (kf.wall() - session["last_customer_time"] > WINDOW_S
                or session["sent_since"] >= MAX_PER_MESSAGE):
            kf.bump("refused_window")
            return _kf_error(95001)
        kf.msgids.add(msgid)
        session["sent_since"] += 1
        session["state"] = 1  # the bot (智能助手) serves the customer
        kf.sent.append({"msgid": msgid, "open_kfid": body["open_kfid"], "touser": customer,
                        "content": content, "time": kf.wall()})
        return error(0, msgid=msgid)
    return answer("kf/send_msg", _checked(handle))


@bp.post("/cgi-bin/kf/service_state/get")
def service_state_get():
    def handle(body: dict, kf: KfState) -> dict:
        if not isinstance(body.get("external_userid"), str):
            return error(40003, "invalid external_userid")
        session = kf.session(body["open_kfid"], body["external_userid"])
        return error(0, service_state=session["state"], servicer_userid=session["servicer_userid"])
    return answer("kf/service_state/get", _checked(handle))


@bp.post("/cgi-bin/kf/service_state/trans")
def service_state_trans():
    def handle(body: dict, kf: KfState) -> dict:
        if not isinstance(body.get("external_userid"), str):
            return error(40003, "invalid external_userid")
        session = kf.session(body["open_kfid"], body["external_userid"])
        target, servicer = body.get("service_state"), body.get("servicer_userid") or ""
        if target not in TRANSITIONS[session["state"]] or (target == 3 and not servicer):
            return _kf_error(95016)
        session.update(state=target, servicer_userid=servicer if target == 3 else "")
        kf.bump("trans")
        return error(0)
    return answer("kf/service_state/trans", _checked(handle))


# -- the customer's side and what the tests read -------------------------------------------------
def event_xml(corp_id: str, token: str, account: str, create_time: int) -> str:
    """kf_msg_or_event as WeCom sends it: no FromUserName, no AgentID, no message."""
    return (f"<xml><ToUserName>{cdata(corp_id)}</ToUserName><CreateTime>{create_time}</CreateTime>"
            f"<MsgType>{cdata('event')}</MsgType><Event>{cdata('kf_msg_or_event')}</Event>"
            f"<Token>{cdata(token)}</Token><OpenKfId>{cdata(account)}</OpenKfId></xml>")


@bp.get("/kf/")
def customer_page():
    """A customer's chat in the browser (WeChat's side of 微信客服)."""
    return render_template("kf.html", account=DEFAULT_ACCOUNT)


@bp.post("/_emulator/kf/send")
def customer_send():
    """A customer writes: {external_userid, content, open_kfid?, send_time?, force_retry?}."""
    body = _body() or {}
    customer, content = body.get("external_userid"), body.get("content")
    account = body.get("open_kfid") or DEFAULT_ACCOUNT
    if not isinstance(customer, str) or not customer or not isinstance(content, str):
        return jsonify(error="external_userid and content are required"), 400
    kf = kf_state()
    if account not in kf.accounts:
        return jsonify(error="unknown open_kfid"), 400
    send_time = body.get("send_time")
    if send_time is not None and not isinstance(send_time, int):
        return jsonify(error="send_time must be an integer"), 400
    written = kf.customer_writes(account, customer, content, send_time)
    st = emulator_state()
    xml = event_xml(st.config.corp_id, written["token"], account, int(st.wall()))
    deliverer = current_app.extensions["wecom_emulator_deliverer"]
    written["delivery_id"] = deliverer.send_xml(xml, f"kf:{account}", bool(body.get("force_retry")))
    return jsonify(written)


@bp.post("/_emulator/kf/end")
def servicer_ends():
    """The servicer ends the customer's session (state 4): the bot may answer the next message."""
    body = _body() or {}
    kf = kf_state()
    with kf.lock:
        session = kf.session(body.get("open_kfid") or DEFAULT_ACCOUNT, str(body.get("external_userid")))
        session.update(state=4, servicer_userid="")
    return jsonify(ok=True)


@bp.get("/_emulator/kf/messages")
def customer_received():
    kf = kf_state()
    customer = request.args.get("external_userid")
    with kf.lock:
        return jsonify(messages=[dict(m) for m in kf.sent if customer in (None, m["touser"])])


@bp.get("/_emulator/kf/sessions")
def sessions():
    kf = kf_state()
    with kf.lock:
        return jsonify(sessions=[{"open_kfid": a, "external_userid": c, **s}
                                 for (a, c), s in kf.sessions.items()], counts=dict(kf.counts))
