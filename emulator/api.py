"""WeCom's HTTP API as the app sees it: ``/cgi-bin/gettoken``, ``message/send``, ``user/get``,
``department/list``, ``department/get``, ``appchat/create``/``get``/``update`` (group chats: ``emulator.chats``).

Like the real service every answer is HTTP 200 with ``{"errcode", "errmsg", ...}`` (errmsg carries
a ``hint`` and the ``more info at`` link), except a queued HTTP fault. The checks run in roughly
WeCom's order: credentials, body, agentid, msgtype, content, receivers.
"""

from __future__ import annotations

import json
import logging
import secrets
import time

from flask import Blueprint, Response, current_app, jsonify, request

from emulator.chats import ChatError
from emulator.state import EmulatorState

log = logging.getLogger("emulator")
bp = Blueprint("wecom_api", __name__, url_prefix="/cgi-bin")

# The emulator's errcode for an unknown or spent response_code (WeCom documents the one-use rule,
# not its code); the app treats any errcode of update_template_card the same way.
INVALID_RESPONSE_CODE = 40058

ERRMSG = {
    -1: "system busy",
    0: "ok",
    40001: "invalid credential, access_token is invalid or not latest",
    40007: "invalid media_id",
    40008: "invalid message type",
    40013: "invalid corpid",
    40014: "invalid access_token",
    40056: "invalid agentid",
    41001: "access_token missing",
    41002: "corpid missing",
    41004: "corpsecret missing",
    41009: "missing userid",
    41011: "missing agentid",
    42001: "access_token expired",
    44004: "empty content",
    45002: "content size out of limit",
    45009: "api freq out of limit",
    47001: "data format error",
    60020: "not allow to access from your ip",
    60111: "userid not found",
    60123: "invalid party id",
    81013: "user & party & tag all invalid",
    86001: "invalid chatid",
    86003: "chatid not found",
    86006: "invalid chat member count",
    86007: "invalid chat member",
    86008: "not allow to operate a chat the app did not create",
    301002: "not allow operate another agent with this accesstoken.",
    INVALID_RESPONSE_CODE: "invalid response_code, it is unknown, used or expired",
}

# msgtype -> the fields its object must carry (text and markdown are checked for size as well)
MSGTYPES = {
    "text": ("content",), "markdown": ("content",), "image": ("media_id",),
    "voice": ("media_id",), "video": ("media_id",), "file": ("media_id",),
    "textcard": ("title", "description", "url"), "news": ("articles",), "mpnews": ("articles",),
    "miniprogram_notice": ("appid", "title"), "template_card": ("card_type",),
}
_HTTP_BODIES = {502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Time-out"}


def state() -> EmulatorState:
    return current_app.extensions["wecom_emulator"]


def error(code: int, errmsg: str | None = None, **extra) -> dict:
    if code == 0:
        return {"errcode": 0, "errmsg": "ok", **extra}
    hint = f"[{int(time.time())}{secrets.randbelow(10**9):09d}]"
    text = errmsg or ERRMSG.get(code, "unknown error")
    remote = request.remote_addr or "127.0.0.1"
    return {"errcode": code, "errmsg": f"{text}, hint: {hint}, from ip: {remote}, more info at "
            f"https://open.work.weixin.qq.com/devtool/query?e={code}", **extra}


def answer(api: str, handle) -> Response:
    """Apply the next queued fault for ``api``, else run ``handle() -> dict``, and count it."""
    st = state()
    fault = st.pop_fault(api)
    if fault and fault.delay:
        st.stopping.wait(fault.delay)
    if fault and fault.http_status:
        st.count(api, http_status=fault.http_status)
        log.info("%s fault http_status=%s", api, fault.http_status)
        reason = _HTTP_BODIES.get(fault.http_status, "Internal Server Error")
        return Response(f"<html><body><h1>{fault.http_status} {reason}</h1></body></html>",
                        status=fault.http_status, mimetype="text/html")
    if fault and fault.errcode is not None:
        body = error(fault.errcode, fault.errmsg)
        log.info("%s fault errcode=%s", api, fault.errcode)
    else:
        body = handle()
    st.count(api, errcode=body["errcode"])
    return jsonify(body)


# -- gettoken -------------------------------------------------------------------------------
@bp.get("/gettoken")
def gettoken():
    return answer("gettoken", _gettoken)


def _gettoken() -> dict:
    cfg = state().config
    corpid, secret = request.args.get("corpid", ""), request.args.get("corpsecret", "")
    if not corpid:
        return error(41002)
    if not secrets.compare_digest(corpid.encode(), cfg.corp_id.encode()):
        return error(40013)
    if not secret:
        return error(41004)
    if not secrets.compare_digest(secret.encode(), cfg.secret.encode()):
        return error(40001)
    token, expires_in = state().issue_token()
    log.info("gettoken issued expires_in=%s", expires_in)
    return error(0, access_token=token, expires_in=expires_in)


# -- message/send ---------------------------------------------------------------------------
@bp.post("/message/send")
def message_send():
    return answer("message/send", _message_send)


def _message_send() -> dict:
    st = state()
    cfg = st.config
    code = st.check_token(request.args.get("access_token"))
    if code:
        return error(code)
    try:
        body = json.loads(request.get_data() or b"")
    except (ValueError, UnicodeDecodeError):
        return error(47001)
    if not isinstance(body, dict):
        return error(47001)

    agentid = body.get("agentid")
    if agentid in (None, ""):
        return error(41011)
    try:
        agentid = int(agentid)
    except (TypeError, ValueError):
        return error(40056)
    if agentid != cfg.agent_id:
        return error(301002)

    msgtype = body.get("msgtype")
    if msgtype not in MSGTYPES:
        return error(40008)
    payload = body.get(msgtype)
    if not isinstance(payload, dict):
        return error(40008, f"invalid message type, missing {msgtype} object")
    code, payload = _check_payload(msgtype, payload)
    if code:
        return error(code)

    users, invalid = _receivers(body)
    if not users:
        return error(81013, **invalid)

    msgid = secrets.token_urlsafe(36)
    interval = _duplicate_interval(body)
    delivered = suppressed = 0
    response_codes: list[str] = []
    for userid in users:
        if interval and st.is_duplicate(userid, {"msgtype": msgtype, msgtype: payload}, interval):
            suppressed += 1
            continue
        stored = st.store_message({
            "msgid": msgid, "touser": userid, "msgtype": msgtype, "agentid": agentid,
            "content": payload.get("content") if msgtype in ("text", "markdown") else None,
            "payload": payload, "time": st.wall(), "source": "message/send",
        })
        if msgtype == "template_card":
            response_codes.append(st.issue_response_code(stored["seq"]))
        delivered += 1
    st.bump("message/send", "delivered", delivered)
    if suppressed:
        st.bump("message/send", "duplicates_suppressed", suppressed)
    log.info("message/send msgid=%s msgtype=%s delivered=%d suppressed=%d invalid=%d",
             msgid[:8], msgtype, delivered, suppressed, sum(len(v.split("|")) for v in invalid.values()))
    if response_codes:  # WeCom: one code with the send, for updating the card(s) once
        invalid["response_code"] = response_codes[0]
    return error(0, msgid=msgid, **invalid)


# -- message/update_template_card ------------------------------------------------------------
@bp.post("/message/update_template_card")
def update_template_card():
    return answer("message/update_template_card", _update_template_card)


def _update_template_card() -> dict:
    """更新模版卡片消息: ``button.replace_name`` greys the buttons out with that text, or
    ``template_card`` replaces the card; the ``response_code`` works once."""
    st = state()
    code = st.check_token(request.args.get("access_token"))
    if code:
        return error(code)
    try:
        body = json.loads(request.get_data() or b"")
    except (ValueError, UnicodeDecodeError):
        return error(47001)
    if not isinstance(body, dict):
        return error(47001)
    try:
        agentid = int(body.get("agentid"))
    except (TypeError, ValueError):
        return error(41011)
    if agentid != st.config.agent_id:
        return error(301002)
    button, card = body.get("button"), body.get("template_card")
    if not (isinstance(button, dict) and button.get("replace_name")) and not isinstance(card, dict):
        return error(47001, "data format error, button.replace_name or template_card required")
    message = st.use_response_code(str(body.get("response_code") or ""))
    if message is None:
        return error(INVALID_RESPONSE_CODE)
    with st.lock:
        if isinstance(card, dict):
            message["payload"] = card
            message["card_update"] = {"template_card": True}
        else:
            message["card_update"] = {"replace_name": str(button["replace_name"])}
        message["updated_time"] = st.wall()
    st.bump("message/update_template_card", "updated")
    log.info("update_template_card seq=%s", message["seq"])
    return error(0)


def _check_payload(msgtype: str, payload: dict) -> tuple[int, dict]:
    cfg = state().config
    if msgtype in ("text", "markdown"):
        content = payload.get("content")
        if not isinstance(content, str) or not content:
            return 44004, payload
        limit = cfg.text_limit if msgtype == "text" else cfg.markdown_limit
        raw = content.encode("utf-8")
        if len(raw) > limit:
            if cfg.oversize != "truncate":
                return 45002, payload
            payload = dict(payload, content=raw[:limit].decode("utf-8", errors="ignore"))
        return 0, payload
    for name in MSGTYPES[msgtype]:
        if not payload.get(name):
            return (40007 if name == "media_id" else 40008), payload
    return 0, payload


def _split(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        value = "|".join(str(v) for v in value)
    return [part.strip() for part in str(value).split("|") if part.strip()]


def _receivers(body: dict) -> tuple[list[str], dict]:
    """Valid userids in order (no repeats) and WeCom's invaliduser/invalidparty/invalidtag."""
    directory = state().directory
    users: list[str] = []
    invalid: dict[str, list[str]] = {"invaliduser": [], "invalidparty": [], "invalidtag": []}
    touser = _split(body.get("touser"))
    if "@all" in touser:
        users = [u["userid"] for u in directory.users if u.get("status", 1) == 1]
    else:
        for userid in touser:
            user = directory.user(userid)
            if user is None:
                invalid["invaliduser"].append(userid.lower())
            elif user["userid"] not in users:
                users.append(user["userid"])
        for party in _split(body.get("toparty")):
            if directory.department(party) is None:
                invalid["invalidparty"].append(party)
            else:
                users.extend(u for u in directory.members(int(party)) if u not in users)
        # The emulated corp defines no tags, so every tag id is invalid.
        invalid["invalidtag"] = _split(body.get("totag"))
    return users, {k: "|".join(v) for k, v in invalid.items() if v}


def _duplicate_interval(body: dict) -> float:
    if str(body.get("enable_duplicate_check", 0)) not in ("1", "True", "true"):
        return 0.0
    try:
        interval = float(body.get("duplicate_check_interval") or 1800)
    except (TypeError, ValueError):
        interval = 1800.0
    return max(0.0, min(interval, 4 * 3600.0))  # WeCom: default 1800 s, at most 4 hours


# -- address book ---------------------------------------------------------------------------
@bp.get("/user/get")
def user_get():
    return answer("user/get", _user_get)


def _user_get() -> dict:
    st = state()
    code = st.check_token(request.args.get("access_token"))
    if code:
        return error(code)
    userid = request.args.get("userid", "")
    if not userid:
        return error(41009)
    user = st.directory.user(userid)
    if user is None:
        return error(60111)
    return error(0, **user)


@bp.get("/department/list")
def department_list():
    return answer("department/list", _department_list)


def _department_list() -> dict:
    st = state()
    code = st.check_token(request.args.get("access_token"))
    if code:
        return error(code)
    dept_id = request.args.get("id")
    if dept_id:
        found = st.directory.subtree(dept_id)
        if not found:
            return error(60123)
        return error(0, department=found)
    return error(0, department=st.directory.departments)


@bp.get("/department/get")
def department_get():
    return answer("department/get", _department_get)


def _department_get() -> dict:
    """One department with its heads (``department_leader``), as WeCom answers it since 2022."""
    st = state()
    code = st.check_token(request.args.get("access_token"))
    if code:
        return error(code)
    dept_id = request.args.get("id", "")
    if not dept_id:
        return error(41009, "missing id")
    department = st.directory.department(dept_id)
    if department is None:
        return error(60123)
    fields = {k: department[k] for k in ("id", "name", "name_en", "parentid", "order") if k in department}
    return error(0, department={**fields, "department_leader": st.directory.leaders(dept_id)})


# -- group chats (appchat) ------------------------------------------------------------------
def _json_object() -> dict | None:
    try:
        body = json.loads(request.get_data() or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


@bp.post("/appchat/create")
def appchat_create():
    return answer("appchat/create", _appchat_create)


def _appchat_create() -> dict:
    st = state()
    code = st.check_token(request.args.get("access_token"))
    if code:
        return error(code)
    body = _json_object()
    if body is None:
        return error(47001)
    try:
        chat = st.chats.create(body.get("userlist"), chatid=body.get("chatid") or "",
                               name=body.get("name") or "", owner=body.get("owner") or "")
    except ChatError as exc:
        return error(exc.errcode, str(exc))
    return error(0, chatid=chat["chatid"])


@bp.get("/appchat/get")
def appchat_get():
    return answer("appchat/get", _appchat_get)


def _appchat_get() -> dict:
    st = state()
    code = st.check_token(request.args.get("access_token"))
    if code:
        return error(code)
    try:
        return error(0, chat_info=st.chats.get(request.args.get("chatid", "")))
    except ChatError as exc:
        return error(exc.errcode, str(exc))


@bp.post("/appchat/update")
def appchat_update():
    return answer("appchat/update", _appchat_update)


def _appchat_update() -> dict:
    st = state()
    code = st.check_token(request.args.get("access_token"))
    if code:
        return error(code)
    body = _json_object()
    if body is None:
        return error(47001)
    try:
        st.chats.update(str(body.get("chatid") or ""), add=body.get("add_user_list") or (),
                        remove=body.get("del_user_list") or (), name=body.get("name"))
    except ChatError as exc:
        return error(exc.errcode, str(exc))
    return error(0)
