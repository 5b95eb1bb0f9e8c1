"""The AI bot's long connection, WeCom's side: a WebSocket server the app's connection dials.

``ws://127.0.0.1:<aibot_ws_port>`` (``websockets``' threaded server, beside the HTTP one). A
client must ``aibot_subscribe`` with the bot id and secret first (errcode 40001 otherwise, and
the connection is closed); ``ping`` is acknowledged. One connection per bot, as WeCom keeps it:
a second subscription gets the first connection a ``disconnected_event`` and closes it (counted
in ``stats["aibot_ws"]["replaced"]``: with the app's lease it should stay 0).

A person or a test sends with ``send`` (``POST /_emulator/aibot/send {"mode": "ws", ...}``): the
message is pushed as ``aibot_msg_callback`` with a fresh ``req_id`` to the subscribed connection,
or held until one subscribes; any kind the callback mode sends (voice, image, file, mixed), each
image and file with its own ``aeskey`` (``own_keys``). Replies are ``aibot_respond_msg`` stream frames on that req_id,
from any connection of the bot (a new holder may finish what the old one began); each replaces
the stream's text, and the first frame with ``finish`` ends the turn (a later one for the same
stream is acknowledged and counted as ``duplicate_finish``, shown to nobody). A message no frame
answered before its connection closed is pushed again, same msgid, new req_id, to the next
subscribed connection (the app deduplicates by msgid). A ``stream.feedback.id`` on the first
frame of a message's req_id makes the reply ratable (``AibotDeliverer.rate``); the rating is an
``aibot_event_callback`` frame (``feedback_event``) that no frame answers. ``aibot_send_msg``
(the bot writing first: markdown or a template card, to a member's single chat or a group) is
acknowledged and shown as an outbound message (``source: aibot_ws_send``); text is refused
(40008), as WeCom refuses it there. Images and files come as ``aibot_send_msg`` with the
``media_id`` that ``aibot_upload_media_init``/``chunk``/``finish`` gave (``emulator.aibot_uploads``).
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import threading
import time
from urllib.parse import quote

from app.wecom import aibot_ws as proto
from emulator.aibot import feedback_of, summary
from emulator.aibot_uploads import MediaUploads
from emulator.callbacks import CallbackError
from emulator.state import EmulatorState

log = logging.getLogger("emulator")
BAD_SECRET = 40001
UNKNOWN_REQ_ID = 40058  # WeCom's "invalid parameter"
STREAM_EXPIRED = 846608
INVALID_MSGTYPE = 40008
PUSH_TYPES = ("markdown", "template_card", "image", "file")
PUSH_MAX_BYTES = 20480


def own_keys(body: dict) -> None:
    """Give each image and file of a message its own ``aeskey``, as WeCom's long connection does
    (the callback's are sealed with the bot's EncodingAESKey); its URL then serves the bytes
    sealed with that key (``media.aibot_media``)."""
    kind = body.get("msgtype")
    if kind in ("image", "file"):
        items = [body[kind]]
    elif kind == "mixed":
        items = [i["image"] for i in body["mixed"]["msg_item"] if i.get("msgtype") == "image"]
    else:
        items = []
    for item in items:
        key = base64.b64encode(secrets.token_bytes(32)).decode()
        item["aeskey"] = key
        item["url"] += "?aeskey=" + quote(key, safe="")


class LongConnection:
    def __init__(self, state: EmulatorState, aibot):
        self.state = state
        self.aibot = aibot  # the callback deliverer: the same message shapes and records
        aibot.long_connection = self  # it rates a reply over the connection that carried it
        self.current = None  # the subscribed connection
        self.by_req: dict[str, int] = {}  # req_id -> delivery id
        self.waiting: list[int] = []  # deliveries to push when a connection subscribes
        self.done: dict[int, threading.Event] = {}
        self.server = None
        self.connections = 0
        self.answer_pings = True  # False: a connection that went silent (the bot must notice)
        self.uploads = MediaUploads(state)
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        cfg = self.state.config
        return bool(cfg.aibot_bot_id and cfg.aibot_secret)

    # -- the server -----------------------------------------------------------------------------
    def start(self) -> int:
        from websockets.sync.server import serve

        cfg = self.state.config
        self.server = serve(self._handle, cfg.host if cfg.host else "127.0.0.1", cfg.aibot_ws_port,
                            max_size=proto.MAX_FRAME_BYTES)
        self._thread = threading.Thread(target=self.server.serve_forever, name="wecom-emulator-ws",
                                        daemon=True)
        self._thread.start()
        port = self.server.socket.getsockname()[1]
        log.info("AI bot long connection on ws://127.0.0.1:%d", port)
        return port

    @property
    def port(self) -> int | None:
        return self.server.socket.getsockname()[1] if self.server is not None else None

    def stop(self, timeout: float = 5.0) -> None:
        if self.server is not None:
            self.server.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    def _handle(self, conn) -> None:
        st = self.state
        subscribed = False
        conn.pushed = set()  # deliveries pushed to this connection
        with st.lock:
            self.connections += 1
            conn.number = self.connections
        try:
            for raw in conn:
                try:
                    frame = proto.decode(raw)
                except proto.FrameError:
                    st.bump("aibot_ws", "bad_frame")
                    continue
                if frame.cmd == proto.SUBSCRIBE:
                    body = frame.body or {}
                    cfg = st.config
                    if body.get("bot_id") != cfg.aibot_bot_id or not secrets.compare_digest(
                            str(body.get("secret") or ""), cfg.aibot_secret or "-"):
                        st.bump("aibot_ws", "subscribe_refused")
                        conn.send(proto.ack(frame.req_id, BAD_SECRET, "invalid bot_id or secret").encode())
                        return
                    self._subscribed(conn, frame)
                    subscribed = True
                elif not subscribed:
                    conn.send(proto.ack(frame.req_id, BAD_SECRET, "subscribe first").encode())
                elif frame.cmd == proto.PING:
                    st.bump("aibot_ws", "ping")
                    if self.answer_pings:
                        conn.send(proto.ack(frame.req_id).encode())
                elif frame.cmd == proto.RESPOND:
                    conn.send(self._respond(frame, conn.number).encode())
                elif frame.cmd == proto.RESPOND_WELCOME:
                    conn.send(self._welcome(frame).encode())
                elif frame.cmd == proto.SEND:
                    conn.send(self._pushed(frame).encode())
                elif frame.cmd in (proto.UPLOAD_INIT, proto.UPLOAD_CHUNK, proto.UPLOAD_FINISH):
                    conn.send(self.uploads.handle(frame).encode())
                else:
                    conn.send(proto.ack(frame.req_id, UNKNOWN_REQ_ID, "unknown cmd").encode())
        except Exception as exc:  # noqa: BLE001 - a connection's end, however it comes
            log.info("long connection ended: %s", type(exc).__name__)
        finally:
            self._closed(conn)

    def _subscribed(self, conn, frame) -> None:
        st = self.state
        with st.lock:
            old, self.current = self.current, conn
            waiting, self.waiting = self.waiting, []
        if old is not None and old is not conn:
            st.bump("aibot_ws", "replaced")
            try:
                old.send(proto.Frame(proto.EVENT_CALLBACK, proto.new_req_id("event"), {
                    "msgid": secrets.token_hex(16), "aibotid": st.config.aibot_id, "msgtype": "event",
                    "event": {"eventtype": proto.DISCONNECTED_EVENT}}).encode())
                old.close()
            except Exception:  # noqa: BLE001, S110 - the old one may be gone already
                pass
        st.bump("aibot_ws", "subscribed")
        conn.send(proto.ack(frame.req_id).encode())
        for delivery_id in waiting:
            self._push(delivery_id)

    def _closed(self, conn) -> None:
        st = self.state
        with st.lock:
            if self.current is conn:
                self.current = None
            # messages this connection was given and never answered: WeCom pushes them again
            again = [d for d in getattr(conn, "pushed", ()) if st.aibot.get(d, {}).get("status") == "pushed"
                     and d not in self.waiting]
            for delivery_id in again:
                st.aibot[delivery_id]["status"] = "pending"
            self.waiting.extend(again)
        st.bump("aibot_ws", "closed")
        if again and self.current is not None:
            with st.lock:
                waiting, self.waiting = self.waiting, []
            for delivery_id in waiting:
                self._push(delivery_id)

    # -- a user writes to the bot ---------------------------------------------------------------
    def send(self, spec: dict, wait: float = 0.0) -> dict:
        st, cfg = self.state, self.state.config
        if not self.enabled:
            raise CallbackError("the AI bot's long connection is not configured (AIBOT_BOT_ID, AIBOT_SECRET)")
        body, info = self.aibot._message(spec)
        own_keys(body)
        delivery_id = st.next_delivery_id()
        st.store_inbound({"delivery_id": delivery_id, "msg_id": body["msgid"], "channel": "aibot_ws",
                          "from_user": info["from_user"], "chat_id": info["chat_id"],
                          "msg_type": body["msgtype"], "content": summary(body), "time": st.wall()})
        done = threading.Event()
        with st.lock:
            st.aibot[delivery_id] = dict(info, delivery_id=delivery_id, msg_id=body["msgid"], mode="ws",
                                         body=body, stream_id=None, status="pending", refreshes=[],
                                         final=None, error=None, pushes=0, duplicate_finish=0,
                                         began=time.monotonic())
            self.done[delivery_id] = done
            while len(st.aibot) > cfg.max_items:
                st.aibot.popitem(last=False)
            connected = self.current is not None
            if not connected:
                self.waiting.append(delivery_id)
        if connected:
            self._push(delivery_id)
        answer = {"msg_id": body["msgid"], "delivery_id": delivery_id, "connected": connected}
        if wait:
            done.wait(min(float(wait), cfg.aibot_stream_expiry + 30))
            answer["conversation"] = self.conversation(delivery_id)
        return answer

    def enter_chat(self, user: str) -> dict:
        """The ``enter_chat`` event: the bot may answer with a welcome within 5 s."""
        st = self.state
        if not self.enabled:
            raise CallbackError("the AI bot's long connection is not configured (AIBOT_BOT_ID, AIBOT_SECRET)")
        if st.directory.user(user or "") is None:
            raise CallbackError("from_user is not in the directory")
        delivery_id = st.next_delivery_id()
        req_id = proto.new_req_id("event")
        with st.lock:
            st.aibot[delivery_id] = {"delivery_id": delivery_id, "mode": "ws", "from_user": user,
                                     "chat_type": "single", "chat_id": "", "status": "event",
                                     "event": "enter_chat", "final": None, "refreshes": []}
            self.by_req[req_id] = delivery_id
            conn = self.current
        if conn is None:
            raise CallbackError("no long connection is subscribed")
        conn.send(proto.Frame(proto.EVENT_CALLBACK, req_id, {
            "msgid": secrets.token_hex(16), "aibotid": st.config.aibot_id, "msgtype": "event",
            "create_time": int(st.wall()), "from": {"userid": user}, "chattype": "single",
            "event": {"eventtype": "enter_chat"}}).encode())
        return {"delivery_id": delivery_id}

    def send_event(self, body: dict) -> None:
        """An event no frame answers (a ``feedback_event``) to the subscribed connection."""
        with self.state.lock:
            conn = self.current
        if conn is None:
            raise CallbackError("no long connection is subscribed")
        conn.send(proto.Frame(proto.EVENT_CALLBACK, proto.new_req_id("event"), body).encode())
        self.state.bump("aibot_ws", "event")

    def _push(self, delivery_id: int) -> None:
        st = self.state
        req_id = proto.new_req_id(proto.MSG_CALLBACK)
        with st.lock:
            record = st.aibot.get(delivery_id)
            conn = self.current
            if record is None or record["status"] not in ("pending",):
                return
            if conn is None:
                self.waiting.append(delivery_id)
                return
            record["status"] = "pushed"
            record["pushes"] += 1
            record["req_id"] = req_id
            record["req_frames"] = 0  # frames answered on this req_id: the first may carry feedback
            self.by_req[req_id] = delivery_id
            conn.pushed.add(delivery_id)
            body = record["body"]
        try:
            conn.send(proto.Frame(proto.MSG_CALLBACK, req_id, body).encode())
            st.bump("aibot_ws", "pushed")
        except Exception:  # noqa: BLE001 - closed under us (maybe after _closed looked): again later
            log.info("push failed delivery=%d", delivery_id)
            with st.lock:
                if record["status"] == "pushed" and record.get("req_id") == req_id:
                    record["status"] = "pending"
                    if delivery_id not in self.waiting:
                        self.waiting.append(delivery_id)
                retry = self.current is not None and self.current is not conn
            if retry:
                self._push(delivery_id)

    def _respond(self, frame, connection: int) -> proto.Frame:
        st = self.state
        body = frame.body or {}
        stream = body.get("stream") if isinstance(body.get("stream"), dict) else None
        with st.lock:
            delivery_id = self.by_req.get(frame.req_id)
            record = st.aibot.get(delivery_id) if delivery_id is not None else None
            if record is None:
                st.bump("aibot_ws", "unknown_req_id")
                return proto.ack(frame.req_id, UNKNOWN_REQ_ID, "invalid req_id")
            if body.get("msgtype") != "stream" or stream is None or not stream.get("id"):
                st.bump("aibot_ws", "bad_respond")
                return proto.ack(frame.req_id, UNKNOWN_REQ_ID, "stream body expected")
            if record["status"] in ("finished", "expired"):
                if record["status"] == "finished" and stream.get("id") == record["stream_id"]:
                    record["duplicate_finish"] += 1  # a new holder repeating the last frame
                    return proto.ack(frame.req_id)
                return proto.ack(frame.req_id, STREAM_EXPIRED, "stream finished or expired")
            if record["stream_id"] not in (None, stream["id"]):
                st.bump("aibot_ws", "second_stream")
            if stream.get("feedback") is not None:  # WeCom reads it from a reply's first frame only
                first = frame.req_id == record.get("req_id") and not record.get("req_frames")
                if first and feedback_of(stream):
                    record["feedback_id"] = feedback_of(stream)
                else:
                    st.bump("aibot_ws", "late_feedback" if feedback_of(stream) else "bad_feedback")
            if frame.req_id == record.get("req_id"):
                record["req_frames"] = record.get("req_frames", 0) + 1
            record["stream_id"] = stream["id"]
            record["status"] = "streaming"
            content = str(stream.get("content") or "")
            finish = bool(stream.get("finish"))
            record["refreshes"].append({"kind": "frame", "content": content, "finish": finish,
                                        "stream_id": stream["id"], "connection": connection})
            if time.monotonic() - record.get("began", time.monotonic()) > st.config.aibot_stream_expiry:
                record["status"] = "expired"
                record["error"] = STREAM_EXPIRED
                finish = False
        if finish:
            self._finish(delivery_id, content)
        return proto.ack(frame.req_id)

    def _finish(self, delivery_id: int, content: str) -> None:
        st = self.state
        with st.lock:
            record = st.aibot[delivery_id]
            record.update(status="finished", final=content)
            done = self.done.pop(delivery_id, None)
        st.store_message({"msgid": None, "touser": record["from_user"], "chat_id": record["chat_id"],
                          "msgtype": "stream", "content": content, "payload": {}, "agentid": None,
                          "time": st.wall(), "source": "aibot_ws", "delivery_id": delivery_id,
                          "stream_id": record["stream_id"], "feedback_id": record.get("feedback_id")})
        st.bump("aibot_ws", "finished")
        if done is not None:
            done.set()

    def _welcome(self, frame) -> proto.Frame:
        st = self.state
        with st.lock:
            delivery_id = self.by_req.get(frame.req_id)
            record = st.aibot.get(delivery_id) if delivery_id is not None else None
            if record is None or record.get("event") != "enter_chat" or record["final"] is not None:
                return proto.ack(frame.req_id, UNKNOWN_REQ_ID, "invalid req_id")
            content = ((frame.body or {}).get("text") or {}).get("content", "")
            record.update(status="welcomed", final=content)
        st.store_message({"msgid": None, "touser": record["from_user"], "chat_id": "", "msgtype": "text",
                          "content": content, "payload": {}, "agentid": None, "time": st.wall(),
                          "source": "aibot_ws_welcome", "delivery_id": delivery_id})
        return proto.ack(frame.req_id)

    def _pushed(self, frame) -> proto.Frame:
        """``aibot_send_msg``: the bot writes first (a markdown or a template card) to a user's
        single chat (``chatid`` = the userid) or a group chat; shown as an outbound message."""
        st = self.state
        body = frame.body or {}
        chatid, msgtype = body.get("chatid"), body.get("msgtype")
        if not isinstance(chatid, str) or not chatid.strip():
            st.bump("aibot_ws", "send_refused")
            return proto.ack(frame.req_id, UNKNOWN_REQ_ID, "chatid required")
        if msgtype not in PUSH_TYPES:  # WeCom takes neither text nor stream here
            st.bump("aibot_ws", "send_refused")
            return proto.ack(frame.req_id, INVALID_MSGTYPE, "invalid message type")
        item = body.get(msgtype)
        if msgtype in ("image", "file") and not (isinstance(item, dict) and self.uploads.known(
                str(item.get("media_id") or ""), msgtype)):
            st.bump("aibot_ws", "send_refused")
            return proto.ack(frame.req_id, 40007, "invalid media_id")
        content = item.get("content") if isinstance(item, dict) and msgtype == "markdown" else None
        if msgtype == "markdown" and (not isinstance(content, str) or not content.strip()
                                      or len(content.encode()) > PUSH_MAX_BYTES):
            st.bump("aibot_ws", "send_refused")
            return proto.ack(frame.req_id, UNKNOWN_REQ_ID, "markdown.content empty or too long")
        group = body.get("chat_type") == 2
        if not group and st.directory.user(chatid) is None:
            st.bump("aibot_ws", "send_refused")
            return proto.ack(frame.req_id, UNKNOWN_REQ_ID, "chatid is not a member")
        st.store_message({"msgid": None, "touser": "" if group else chatid.lower(),
                          "chat_id": chatid if group else "", "msgtype": msgtype, "content": content,
                          "payload": body, "agentid": None, "time": st.wall(),
                          "source": "aibot_ws_send"})
        st.bump("aibot_ws", "sent")
        return proto.ack(frame.req_id)

    def drop(self) -> bool:
        """Close the subscribed connection as a network fault would (the bot reconnects)."""
        with self.state.lock:
            conn = self.current
        if conn is None:
            return False
        self.state.bump("aibot_ws", "dropped")
        conn.close()
        return True

    def conversation(self, delivery_id: int) -> dict | None:
        with self.state.lock:
            record = self.state.aibot.get(delivery_id)
            return json.loads(json.dumps(record, default=str)) if record is not None else None

    def status(self) -> dict:
        with self.state.lock:
            return {"enabled": self.enabled, "connected": self.current is not None, "port": self.port,
                    "waiting": len(self.waiting), "stats": dict(self.state.stats.get("aibot_ws", {}))}
