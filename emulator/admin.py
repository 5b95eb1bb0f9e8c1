"""The emulator's own controls under ``/_emulator/`` (JSON) and the chat page at ``/``.

Not part of WeCom: this is how a test or a person plays the users (send, verify), breaks WeCom
(faults, token expiry) and looks at what the bot did (messages, callbacks, stats).
"""

from __future__ import annotations

import logging

from flask import Blueprint, current_app, jsonify, render_template, request

from emulator.aibot import AibotDeliverer
from emulator.callbacks import CallbackDeliverer, CallbackError
from emulator.chats import ChatError
from emulator.state import FAULT_APIS, EmulatorState, Fault

log = logging.getLogger("emulator")
bp = Blueprint("emulator_admin", __name__)


def state() -> EmulatorState:
    return current_app.extensions["wecom_emulator"]


def deliverer() -> CallbackDeliverer:
    return current_app.extensions["wecom_emulator_deliverer"]


def aibot() -> AibotDeliverer:
    return current_app.extensions["wecom_emulator_aibot"]


def long_connection():
    return current_app.extensions["wecom_emulator_aibot_ws"]


def bad_request(message: str, status: int = 400):
    return jsonify({"error": message}), status


def _json_body() -> dict:
    body = request.get_json(silent=True)
    return body if isinstance(body, dict) else {}


def _int_arg(name: str, default: int = 0) -> int:
    try:
        return int(request.args.get(name, default))
    except (TypeError, ValueError):
        return default


# -- the chat page ----------------------------------------------------------------------------
@bp.get("/")
def chat_page():
    st = state()
    return render_template("chat.html", users=st.directory.users,
                           departments={d["id"]: d["name"] for d in st.directory.departments},
                           corp_name=st.directory.departments[0]["name"] if st.directory.departments else "",
                           config=st.config.public())


# -- status and settings ----------------------------------------------------------------------
@bp.get("/_emulator/health")
def health():
    return jsonify({"ok": True})


@bp.route("/_emulator/config", methods=["GET", "POST"])
def config():
    """Read the public settings; POST changes where and how callbacks are delivered."""
    cfg = state().config
    if request.method == "POST":
        body = _json_body()
        try:
            if "callback_url" in body:
                cfg.callback_url = str(body["callback_url"])
            for name in ("retries",):
                if name in body:
                    setattr(cfg, name, int(body[name]))
            for name in ("retry_interval", "callback_timeout", "token_ttl"):
                if name in body:
                    setattr(cfg, name, float(body[name]))
            if "token_reuse" in body:
                cfg.token_reuse = bool(body["token_reuse"])
        except (TypeError, ValueError):
            return bad_request("invalid setting value")
    return jsonify(cfg.public())


@bp.get("/_emulator/directory")
def directory():
    return jsonify(state().directory.to_json())


@bp.post("/_emulator/contact")
def contact():
    """An admin changes the address book in WeCom's console: {"userid", "department"?: [ids],
    "main_department"?, "change_type"?: update_user (default) | delete_user, "notify"?: true,
    "wait"?}. The directory changes at once (user/get answers the new record); with ``notify``
    WeCom's ``change_contact`` event goes to the app's callback URL, as it does for an app that
    receives address book events."""
    body = _json_body()
    st = state()
    userid, change = str(body.get("userid") or ""), body.get("change_type") or "update_user"
    try:
        if change == "update_user":
            user = st.directory.update_user(userid, body.get("department"), body.get("main_department"))
        elif change == "delete_user":
            user = st.directory.delete_user(userid)
        else:
            return bad_request("change_type must be update_user or delete_user")
    except KeyError:
        return bad_request("userid is not in the directory", 404)
    except (TypeError, ValueError) as exc:
        return bad_request(str(exc) or "invalid department list")
    log.info("address book changed change_type=%s", change)
    answer = {"user": user}
    if body.get("notify", True):
        spec = {"event": "change_contact", "change_type": change, "userid": user["userid"],
                "department": user["department"] if change == "update_user" and "department" in body else None,
                "main_department": user.get("main_department")}
        try:
            answer["callback"] = deliverer().send(spec, wait=bool(body.get("wait")))
        except CallbackError as exc:
            return bad_request(str(exc))
    return jsonify(answer)


@bp.route("/_emulator/chats", methods=["GET", "POST"])
def chats():
    """GET: every group chat. POST {"userlist", "chatid"?, "name"?, "owner"?, "by_app"?: true}:
    a group chat; ``by_app`` false is a group the AI bot was added to, whose members WeCom will
    not list (appchat/get answers 86008)."""
    st = state()
    if request.method == "GET":
        return jsonify({"chats": st.chats.all()})
    body = _json_body()
    try:
        chat = st.chats.create(body.get("userlist"), chatid=body.get("chatid") or "",
                               name=body.get("name") or "", owner=body.get("owner") or "",
                               by_app=body.get("by_app", True) is not False)
    except ChatError as exc:
        return bad_request(f"{exc} (errcode {exc.errcode})")
    return jsonify(chat)


@bp.post("/_emulator/chats/<chatid>/members")
def chat_members(chatid: str):
    """Members join or leave a group chat: {"add"?: [userids], "remove"?: [userids]}."""
    body = _json_body()
    try:
        chat = state().chats.update(chatid, add=body.get("add") or (), remove=body.get("remove") or (),
                                    by_app_only=False)
    except ChatError as exc:
        return bad_request(f"{exc} (errcode {exc.errcode})", 404 if exc.errcode == 86003 else 400)
    return jsonify(chat)


# -- playing the users ------------------------------------------------------------------------
@bp.post("/_emulator/send")
def send():
    body = _json_body()
    try:
        return jsonify(deliverer().send(body, wait=bool(body.get("wait"))))
    except CallbackError as exc:
        return bad_request(str(exc))


@bp.post("/_emulator/card_click")
def card_click():
    """A user clicks a button of a template card the app sent: {"userid", "task_id", "key",
    "selected"?: {question_key: option id}}. Delivers the ``template_card_event`` callback with a
    fresh ``response_code`` for that card and, for a card with a drop-down (``button_selection``),
    ``SelectedItems``: the option chosen, else the card's ``selected_id`` (else its first), as
    WeCom sends it."""
    body = _json_body()
    st = state()
    userid, task_id, key = (str(body.get(k) or "") for k in ("userid", "task_id", "key"))
    card = st.find_card(userid.lower(), task_id) if userid and task_id else None
    if card is None:
        return bad_request("no such card for this user", 404)
    keys = [b.get("key") for b in (card.get("payload") or {}).get("button_list") or []]
    if key not in keys:
        return bad_request("key is not one of the card's buttons")
    if card.get("card_update"):
        return bad_request("the card was updated: its buttons are no longer clickable", 409)
    selection = (card.get("payload") or {}).get("button_selection")
    selected = {}
    if isinstance(selection, dict):
        options = [str(o.get("id")) for o in selection.get("option_list") or []]
        chosen = str((body.get("selected") or {}).get(selection.get("question_key"))
                     or selection.get("selected_id") or (options[0] if options else ""))
        if chosen not in options:
            return bad_request("the selected option is not one of the card's drop-down")
        selected = {selection.get("question_key"): [chosen]}
    spec = {"from_user": card["touser"], "event": "template_card_event", "event_key": key,
            "task_id": task_id, "card_type": card["payload"].get("card_type", ""),
            "response_code": st.issue_response_code(card["seq"]), "selected": selected,
            "wait": body.get("wait")}
    try:
        return jsonify(deliverer().send(spec, wait=bool(body.get("wait"))))
    except CallbackError as exc:
        return bad_request(str(exc))


@bp.post("/_emulator/verify")
def verify():
    return jsonify(deliverer().verify())


# -- the AI bot (智能机器人) -------------------------------------------------------------------
@bp.post("/_emulator/aibot/send")
def aibot_send():
    """{"from_user", "content", "msg_type"?: text|voice|image|file|mixed, "media_id"?, "media_ids"?,
    "chat_type"?: single|group, "chat_id"?, "mention"?, "msg_id"?, "wait"?,
    "mode"?: "callback" (default) | "ws" (over the long connection)}."""
    body = _json_body()
    try:
        wait = float(body.get("wait") or 0)
    except (TypeError, ValueError):
        return bad_request("wait must be a number of seconds")
    try:
        if body.get("mode") == "ws":
            return jsonify(long_connection().send(body, wait=wait))
        return jsonify(aibot().send(body, wait=wait))
    except CallbackError as exc:
        return bad_request(str(exc))


@bp.get("/_emulator/aibot/conversations")
def aibot_conversations():
    """Every AI bot turn: its stream id, each refresh's content, the final text: ?delivery_id=."""
    delivery_id = _int_arg("delivery_id") or None
    found = aibot().conversations()
    if delivery_id is not None:
        found = [c for c in found if c["delivery_id"] == delivery_id]
    return jsonify({"conversations": found})


@bp.post("/_emulator/aibot/enter_chat")
def aibot_enter_chat():
    """{"from_user"}: the enter_chat event over the long connection (the bot's welcome)."""
    try:
        return jsonify(long_connection().enter_chat(str(_json_body().get("from_user") or "")))
    except CallbackError as exc:
        return bad_request(str(exc))


@bp.post("/_emulator/aibot/feedback")
def aibot_feedback():
    """A user rates an AI bot reply, as WeCom's 👍/👎 under it: {"delivery_id", "type": 1
    accurate | 2 inaccurate | 3 withdrawn, "reasons"?: [1-4] and "content"? (type 2), "from_user"?
    (default the asker), "msg_id"? (the same again: WeCom's second delivery)}. Only a finished
    reply whose first stream reply carried feedback.id can be rated (409 otherwise)."""
    body = _json_body()
    delivery_id = body.get("delivery_id")
    if type(delivery_id) is not int:
        return bad_request("delivery_id must be an integer")
    try:
        return jsonify(aibot().rate(delivery_id, body))
    except CallbackError as exc:
        return bad_request(str(exc), getattr(exc, "status", 400))


@bp.get("/_emulator/aibot/ws")
def aibot_ws_status():
    """The long connection: configured, subscribed now, its port and counters."""
    return jsonify(long_connection().status())


@bp.post("/_emulator/aibot/ws/faults")
def aibot_ws_faults():
    """{"drop": true}: close the subscribed connection; {"answer_pings": false}: stop acking pings."""
    body = _json_body()
    conn = long_connection()
    if "answer_pings" in body:
        conn.answer_pings = bool(body["answer_pings"])
    dropped = conn.drop() if body.get("drop") else False
    return jsonify({"dropped": dropped, "answer_pings": conn.answer_pings})


@bp.post("/_emulator/aibot/verify")
def aibot_verify():
    try:
        return jsonify(aibot().verify())
    except CallbackError as exc:
        return bad_request(str(exc))


# -- breaking WeCom ---------------------------------------------------------------------------
@bp.route("/_emulator/faults", methods=["GET", "POST", "DELETE"])
def faults():
    """POST {"api", "errcode"?, "errmsg"?, "http_status"?, "delay"|"timeout"?, "count"?}."""
    st = state()
    if request.method == "DELETE":
        st.clear_faults(request.args.get("api") or None)
    elif request.method == "POST":
        body = _json_body()
        api = body.get("api")
        if api not in FAULT_APIS:
            return bad_request(f"api must be one of {', '.join(FAULT_APIS)}")
        try:
            fault = Fault(
                errcode=None if body.get("errcode") is None else int(body["errcode"]),
                errmsg=body.get("errmsg"),
                http_status=None if body.get("http_status") is None else int(body["http_status"]),
                delay=float(body.get("delay", body.get("timeout", 0)) or 0),
            )
            count = int(body.get("count", 1))
        except (TypeError, ValueError):
            return bad_request("errcode, http_status, delay and count must be numbers")
        if fault.http_status is not None and not 400 <= fault.http_status <= 599:
            return bad_request("http_status must be 4xx or 5xx")
        if fault.errcode is None and fault.http_status is None and not fault.delay:
            return bad_request("a fault needs errcode, http_status or delay")
        if not 1 <= count <= 1000:
            return bad_request("count must be 1..1000")
        st.push_fault(api, fault, count)
        log.info("fault queued api=%s count=%d", api, count)
    return jsonify({"faults": st.pending_faults()})


@bp.post("/_emulator/tokens/expire")
def expire_tokens():
    """Expire every issued access_token now (or one: {"access_token": ...}): next use -> 42001."""
    return jsonify({"expired": state().expire_tokens(_json_body().get("access_token"))})


# -- looking at what happened -----------------------------------------------------------------
@bp.get("/_emulator/messages")
def messages():
    """What the bot sent, oldest first: ?touser=&since=<seq>&limit=."""
    st = state()
    touser = (request.args.get("touser") or "").lower() or None
    found = st.select(st.messages, since=_int_arg("since"), limit=_int_arg("limit") or None,
                      touser=touser)
    return jsonify({"messages": found, "last_seq": found[-1]["seq"] if found else _int_arg("since")})


@bp.get("/_emulator/inbound")
def inbound():
    """What the users sent through the emulator: ?from_user=&since=."""
    st = state()
    user = (request.args.get("from_user") or "").lower() or None
    found = st.select(st.inbound, since=_int_arg("since"), from_user=user)
    return jsonify({"messages": found})


@bp.get("/_emulator/conversation")
def conversation():
    """One user's chat, both directions, in sequence order: ?userid=&since=&limit= (last 500)."""
    st = state()
    userid = (request.args.get("userid") or "").lower()
    if not userid:
        return bad_request("userid is required")
    since = _int_arg("since")
    items = st.select(st.inbound, since=since, from_user=userid) + \
        st.select(st.messages, since=since, touser=userid)
    items.sort(key=lambda i: i["seq"])
    items = items[-(_int_arg("limit") or 500):]
    deliveries = {}
    with st.lock:
        for item in items:
            d = st.deliveries.get(item.get("delivery_id"))
            if d is not None:
                deliveries[item["delivery_id"]] = dict(d)
    return jsonify({"items": items, "deliveries": deliveries,
                    "last_seq": items[-1]["seq"] if items else since})


@bp.get("/_emulator/callbacks")
def callbacks():
    """Every delivery attempt: ?msg_id=&delivery_id=&since=."""
    st = state()
    msg_id = _int_arg("msg_id") or None
    delivery_id = _int_arg("delivery_id") or None
    found = st.select(st.callbacks, since=_int_arg("since"), msg_id=msg_id, delivery_id=delivery_id)
    with st.lock:
        deliveries = {i: dict(d) for i, d in st.deliveries.items()
                      if delivery_id in (None, i) and msg_id in (None, d.get("msg_id"))}
    return jsonify({"attempts": found, "deliveries": deliveries})


@bp.get("/_emulator/stats")
def stats():
    st = state()
    with st.lock:
        sizes = {"messages": len(st.messages), "inbound": len(st.inbound),
                 "callbacks": len(st.callbacks)}
    return jsonify({"apis": st.snapshot_stats(), "stored": sizes, "faults": st.pending_faults()})


@bp.post("/_emulator/reset")
def reset():
    """Forget messages, callbacks, faults and stats; {"tokens": true} also drops tokens."""
    state().reset(tokens=bool(_json_body().get("tokens")))
    log.info("state reset")
    return jsonify({"ok": True})
