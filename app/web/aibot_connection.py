"""The AI bot's long connection: ``python -m app.web.aibot_connection`` (docs/aibot.md).

The bot dials out to WeCom over a WebSocket (``AIBOT_WS_URL``), subscribes with ``AIBOT_BOT_ID``
and ``AIBOT_SECRET`` and receives its messages there instead of at ``/wecom/aibot``; the frames
are ``app.wecom.aibot_ws``. Run it on as many machines as you like: one holds the connection.

**One holder.** WeCom keeps one connection per bot, so replicas contend for a Redis lease
(``aibot:ws:lease``, ``SET NX PX AIBOT_WS_LEASE_S``). The holder renews it every third of its
life on a thread of its own and closes the WebSocket as soon as a renewal fails or has not
succeeded for 80 % of the lease (a holder cut off from Redis fences itself before anyone else
can take over); the others try every half second, so a holder that dies (SIGKILL included) is
replaced within about ``AIBOT_WS_LEASE_S`` + 0.5 s. A clean stop deletes the lease at once.

**Messages** go the callback's way (``app.web.aibot_callback.askable`` and ``submit``): a group
message only when @mentioned, the outbox row deduplicated by msgid (a message delivered twice, to
two replicas, or by callback and connection, is one row), the worker's task; voice (WeCom's
transcript), images, files and mixed messages as by callback, each image's and file's own
``aeskey`` carried to the worker (worker/media/fetch.py). ``enter_chat`` gets the welcome text
(``aibot_respond_welcome_msg``). A question's first stream frame carries ``feedback.id``
(``app.feedback.ratings``); a ``feedback_event`` (the employee's 👍/👎 on it) goes to the outbox like
the callback's, deduplicated by msgid, and the worker records it.

**Pushes** (``aibot_send_msg``: the bot writing first, e.g. a budget alert to a department
head) are queued in Redis by any process (``app.aibot.pushes``); the holder sends each with the
pump and marks it sent once WeCom acknowledged it (a holder that dies before the ack leaves it to
the next, which sends it again). **Images and files** queued the same way
(``app.aibot.uploads``) are uploaded (``aibot_upload_media_init``/``chunk``/``finish``, one
frame in flight, the next sent on WeCom's ack) and sent with ``aibot_send_msg``.

**Replies** are the stream the worker writes to Redis for the callback's refresh polls
(``app.aibot.streams``); nothing in the worker changes. The holder pushes each stream instead of
waiting to be polled: a Redis hash ``aibot:ws:pending`` (stream id -> the message's ``req_id``)
lists the streams it still owes WeCom, and every ``PUMP_S`` it sends each one's text when it has
changed (``aibot_respond_msg``, the whole text so far), its last frame with ``finish``, and once
WeCom has acknowledged every frame of that req_id marks the stream delivered
(``aibot:ws:delivered:<id>``, for the stream's TTL) and drops the entry. The entry is written
*before* the outbox row, so a holder killed at any point leaves it for the next holder, which
sends the stream's current text and goes on (a stream is replaced by its id, so a frame sent
again shows nothing twice). An entry whose row was never written (the holder died in between) is
dropped unanswered: WeCom pushes a message no frame answered again (the emulator does), and a
message that comes again finds its row by msgid and is answered on its new req_id unless its
stream was delivered.

Never logged: the secret, message contents (frames by cmd and req_id only).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

import redis
from sqlalchemy.exc import SQLAlchemyError

from app import redis_client
from app.aibot.pushes import Pushes
from app.aibot.uploads import MediaPushes, Upload, UploadFailed
from app.intake.protocol import IntakeUnavailable
from app.logging_setup import request_id_var
from app.outbox import rows
from app.web import aibot_callback
from app.web.callback import CallbackRejected
from app.wecom import aibot, aibot_ws
from app.wecom.exceptions import MessageParseError

log = logging.getLogger(__name__)
LEASE_KEY = "aibot:ws:lease"
PENDING_KEY = "aibot:ws:pending"
DELIVERED_PREFIX = "aibot:ws:delivered:"
PUMP_S = 0.2  # how often the holder looks for new stream text (WeCom's own polls: about 1 s)
ACQUIRE_EVERY_S = 0.5
SUBSCRIBE_TIMEOUT_S = 10.0
STORAGE_NOTICE = ("抱歉，系统暂时繁忙，请稍后再发一次。\n"
                  "Sorry, the service is busy right now. Please send your message again shortly.")

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Lease:
    """The Redis lease that makes one replica the connection holder."""

    def __init__(self, client: redis.Redis, ttl_s: float, key: str = LEASE_KEY, clock=time.monotonic):
        self.redis, self.ttl_ms, self.key, self.clock = client, int(ttl_s * 1000), key, clock
        self.token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"
        self._renew, self._release = client.register_script(_RENEW), client.register_script(_RELEASE)
        self.renewed_at = 0.0

    def acquire(self) -> bool:
        before = self.clock()  # the lease's life is counted from before the request, to be safe
        if self.redis.set(self.key, self.token, nx=True, px=self.ttl_ms):
            self.renewed_at = before
            return True
        return False

    def renew(self) -> bool:
        """Extend the lease; False when it is no longer ours (expired and taken)."""
        before = self.clock()
        if self._renew(keys=[self.key], args=[self.token, self.ttl_ms]):
            self.renewed_at = before
            return True
        return False

    def fresh(self) -> bool:
        """Still safely ours: renewed within 80 % of its life (by our own clock)."""
        return self.clock() - self.renewed_at < 0.8 * self.ttl_ms / 1000

    def release(self) -> None:
        try:
            self._release(keys=[self.key], args=[self.token])
        except redis.RedisError:
            log.warning("lease not released (it expires by itself)")


class LeaseKeeper(threading.Thread):
    """Renews the lease every third of its life; sets ``lost`` when it is gone or unsure."""

    def __init__(self, lease: Lease, stopping: threading.Event):
        super().__init__(name="aibot-lease", daemon=True)
        self.lease, self.stopping = lease, stopping
        self.lost = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        interval = self.lease.ttl_ms / 3000
        while not (self.done.wait(interval) or self.lost.is_set()):
            try:
                if not self.lease.renew():
                    log.warning("connection lease lost to another replica")
                    self.lost.set()
            except redis.RedisError as exc:
                log.warning("lease renewal failed: %s", type(exc).__name__)
            if not self.lease.fresh():
                log.warning("lease not renewed in time: giving the connection up")
                self.lost.set()


@dataclass
class Pending:
    """The streams the holder still owes WeCom (stream id -> req_id), kept in Redis."""

    client: redis.Redis
    key: str = PENDING_KEY

    def add(self, stream_id: str, req_id: str, msg_id: str) -> None:
        self.client.hset(self.key, stream_id, json.dumps({"req_id": req_id, "msgid": msg_id,
                                                          "since": time.time()}))

    def get(self, stream_id: str) -> dict | None:
        raw = self.client.hget(self.key, stream_id)
        return json.loads(raw) if raw else None

    def remove(self, stream_id: str) -> None:
        self.client.hdel(self.key, stream_id)

    def delivered(self, stream_id: str, ttl_s: int) -> None:
        """WeCom acknowledged the stream's finish: no longer owed, and never sent again."""
        pipe = self.client.pipeline()
        pipe.set(f"{DELIVERED_PREFIX}{stream_id}", 1, ex=ttl_s)
        pipe.hdel(self.key, stream_id)
        pipe.execute()

    def was_delivered(self, stream_id: str) -> bool:
        return bool(self.client.exists(f"{DELIVERED_PREFIX}{stream_id}"))

    def all(self) -> dict[str, dict]:
        out = {}
        for stream_id, raw in self.client.hgetall(self.key).items():
            try:
                out[stream_id.decode()] = json.loads(raw)
            except ValueError:
                self.client.hdel(self.key, stream_id)
        return out


class ConnectionClosed(Exception):
    """The session ends (the reason says why); the holder reconnects after a backoff."""


@dataclass
class _Sent:
    content: str | None = None
    finish: bool = False


@dataclass
class Session:
    """One WebSocket: subscribe, then frames in, stream frames out, pings, until it ends."""

    holder: Holder
    ws: object
    heartbeat: aibot_ws.Heartbeat
    sent: dict[str, _Sent] = field(default_factory=dict)  # stream id -> last frame sent
    unacked: dict[str, int] = field(default_factory=dict)  # req_id -> respond frames awaiting ack
    finished: dict[str, str] = field(default_factory=dict)  # req_id -> its stream, finish sent
    offered: dict[str, str] = field(default_factory=dict)  # stream id -> feedback id, first frame
    pushing: dict[str, str] = field(default_factory=dict)  # aibot_send_msg req_id -> push key
    uploading: dict[str, Upload] = field(default_factory=dict)  # req_id in flight -> its upload

    def send(self, frame: aibot_ws.Frame) -> None:
        self.ws.send(frame.encode())

    def subscribe(self, bot_id: str, secret: str) -> None:
        frame = aibot_ws.subscribe(bot_id, secret)
        self.send(frame)
        deadline = time.monotonic() + SUBSCRIBE_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                answer = aibot_ws.decode(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            except TimeoutError:
                break
            except aibot_ws.FrameError as exc:
                log.warning("unreadable frame before the subscription was acknowledged: %s", exc)
                continue
            if answer.is_ack and answer.req_id == frame.req_id:
                if answer.errcode != 0:
                    raise ConnectionClosed(f"subscription refused errcode={answer.errcode} "
                                           f"errmsg={answer.errmsg!r}")
                return
        raise ConnectionClosed("subscription not acknowledged")

    def loop(self) -> None:
        holder = self.holder
        next_pump = 0.0
        while True:
            if holder.stopping.is_set():
                raise ConnectionClosed("stopping")
            if holder.keeper.lost.is_set() or not holder.lease.fresh():
                # checked here too, not only by the keeper: a renewal stuck on a slow Redis
                # must not let the lease expire under a connection still open
                raise ConnectionClosed("lease lost")
            if self.heartbeat.due():
                if self.heartbeat.dead:
                    raise ConnectionClosed("heartbeat: pings unanswered")
                self.send(aibot_ws.ping())
                self.heartbeat.sent()
            if time.monotonic() >= next_pump:
                self.pump()
                next_pump = time.monotonic() + PUMP_S
            try:
                raw = self.ws.recv(timeout=0.05)
            except TimeoutError:
                continue
            try:
                frame = aibot_ws.decode(raw)
            except aibot_ws.FrameError as exc:
                log.warning("unreadable frame ignored: %s", exc)
                continue
            self.handle(frame)

    # -- frames from WeCom ---------------------------------------------------------------------
    def handle(self, frame: aibot_ws.Frame) -> None:
        try:
            if frame.is_ack:
                self.acked(frame)
            elif frame.cmd == aibot_ws.MSG_CALLBACK:
                self.on_message(frame)
            elif frame.cmd == aibot_ws.EVENT_CALLBACK:
                self.on_event(frame)
            else:
                log.info("frame ignored cmd=%s", frame.cmd)
        except (ConnectionClosed, OSError, TimeoutError, _ws_errors()):
            raise  # the connection's end: reconnect
        except Exception:  # one frame must not end the service (nor, pushed again, loop it)
            log.exception("frame not handled cmd=%s req_id=%s", frame.cmd or "ack", frame.req_id)

    def acked(self, frame: aibot_ws.Frame) -> None:
        if frame.req_id.startswith(aibot_ws.PING):
            self.heartbeat.acked()
            return
        if frame.req_id in self.pushing:
            self.pushed(frame)
            return
        if frame.req_id in self.uploading:
            self.upload_step(frame)
            return
        if frame.errcode:
            log.warning("frame refused req_id=%s errcode=%s errmsg=%s", frame.req_id, frame.errcode,
                        frame.errmsg)
        left = self.unacked.get(frame.req_id, 0) - 1
        if left > 0:
            self.unacked[frame.req_id] = left
            return
        self.unacked.pop(frame.req_id, None)
        stream_id = self.finished.pop(frame.req_id, None)
        if stream_id is not None:  # WeCom has the whole answer: the stream is no longer owed
            self.holder.pending.delivered(stream_id, self.holder.settings.aibot_stream_ttl_s)
            self.sent.pop(stream_id, None)

    def on_event(self, frame: aibot_ws.Frame) -> None:
        kind = aibot_ws.event_type(frame)
        if kind == "enter_chat":
            self.send(aibot_ws.respond_welcome(frame.req_id, self.holder.services.settings.welcome_message))
        elif kind == aibot_ws.DISCONNECTED_EVENT:
            raise ConnectionClosed("WeCom: a newer connection of this bot replaced this one")
        elif kind == aibot.FEEDBACK_EVENT:
            self.on_feedback(frame)
        else:
            log.info("event ignored eventtype=%s", kind or "?")

    def on_feedback(self, frame: aibot_ws.Frame) -> None:
        """A 👍/👎 on a reply that carried ``feedback.id``: into the outbox (dedup by msgid), the
        worker records it; nothing is sent back. Malformed: a log line."""
        request_id = "ws-" + secrets.token_hex(8)
        token = request_id_var.set(request_id)
        try:
            try:
                message = aibot.parse_message(json.dumps(frame.body or {}), int(time.time()))
            except MessageParseError as exc:
                log.warning("malformed feedback_event ignored req_id=%s: %s", frame.req_id, exc)
                return
            try:
                aibot_callback.accept_feedback(self.holder.services, message, request_id, None)
            except IntakeUnavailable as exc:  # WeCom does not push an event again: it is lost
                log.warning("feedback_event not accepted req_id=%s: %s", frame.req_id, type(exc).__name__)
        finally:
            request_id_var.reset(token)

    def on_message(self, frame: aibot_ws.Frame) -> None:
        holder = self.holder
        services = holder.services
        request_id = "ws-" + secrets.token_hex(8)
        token = request_id_var.set(request_id)
        try:
            try:
                message = aibot.parse_message(json.dumps(frame.body or {}), int(time.time()))
            except MessageParseError as exc:
                log.warning("malformed message ignored req_id=%s: %s", frame.req_id, exc)
                return
            if message.msg_type == "event":
                self.on_event(frame)
                return
            if message.msg_type not in aibot.QUESTION_TYPES:
                self.respond(frame.req_id, aibot.stream_message(
                    aibot_callback.new_stream_id(), aibot_callback.UNSUPPORTED_NOTICE, True))
                return
            asked = aibot_callback.askable(message, services.settings)
            if asked is None:
                log.info("group message without @mention ignored")
                return
            if isinstance(asked, dict):
                self.respond(frame.req_id, asked)
                return
            stream_id = aibot_callback.new_stream_id()
            try:
                holder.pending.add(stream_id, frame.req_id, message.msg_id)  # before the row: see above
                accepted = aibot_callback.submit(services, asked, request_id, None, stream_id)
            except (IntakeUnavailable, redis.RedisError) as exc:
                log.warning("message not accepted: %s", type(exc).__name__)
                with contextlib.suppress(redis.RedisError):
                    holder.pending.remove(stream_id)
                self.respond(frame.req_id, aibot.stream_message(stream_id, STORAGE_NOTICE, True))
                return
            if accepted.created:
                log.info("aibot message accepted over the long connection message_id=%s", accepted.id)
            else:
                holder.pending.remove(stream_id)
                log.info("duplicate aibot message message_id=%s", accepted.id)
                if not accepted.stream_id or holder.pending.was_delivered(accepted.stream_id):
                    return  # answered already: WeCom acknowledged its finish
                # WeCom delivered it again (its first holder died, or this is the first time it
                # comes by the connection): answer on the req_id it gave this time.
                holder.pending.add(accepted.stream_id, frame.req_id, message.msg_id)
                self.sent.pop(accepted.stream_id, None)
            offered = aibot_callback.feedback_of(services, asked, accepted.id)
            if offered:  # on this req_id's first frame (pump)
                self.offered[accepted.stream_id] = offered
            self.pump()
        finally:
            request_id_var.reset(token)

    def unwritten(self, stream_id: str) -> bool:
        """No stream state and no outbox row: the message never reached the outbox."""
        services = self.holder.services
        try:
            if services.streams.get(stream_id) is not None:
                return False
            with services.db.session() as session:
                return rows.by_stream_id(session, stream_id) is None
        except (redis.RedisError, SQLAlchemyError):
            return False

    def respond(self, req_id: str, message: dict) -> None:
        stream = message["stream"]
        self.send(aibot_ws.respond_stream(req_id, stream["id"], stream["content"], stream["finish"]))

    # -- messages the bot writes first (app.aibot.pushes) --------------------------------------
    def push_waiting(self) -> None:
        """Send each queued ``aibot_send_msg`` not yet in flight on this connection."""
        try:
            waiting = self.holder.pushes.waiting()
        except redis.RedisError as exc:
            log.warning("pushes unavailable: %s", type(exc).__name__)
            return
        in_flight = set(self.pushing.values())
        for push in waiting:
            if push.key in in_flight:
                continue
            frame = aibot_ws.send_markdown(push.chatid, push.content)
            self.send(frame)
            self.pushing[frame.req_id] = push.key

    def upload_waiting(self) -> None:
        """Start uploading each queued image or file not yet in flight on this connection."""
        media = self.holder.media
        try:
            waiting = media.waiting()
            busy = {upload.key for upload in self.uploading.values()}
            for push in waiting:
                data = None if push.key in busy else media.data(push.key)
                if data is None:
                    if push.key not in busy:
                        media.drop(push.key)  # its bytes expired
                    continue
                upload = Upload(push.key, push.chatid, push.kind, push.filename, data)
                frame = upload.start()
                self.send(frame)
                self.uploading[frame.req_id] = upload
        except redis.RedisError as exc:
            log.warning("media pushes unavailable: %s", type(exc).__name__)

    def upload_step(self, frame: aibot_ws.Frame) -> None:
        """WeCom's ack of an upload's frame: send its next one; done or refused, settle it."""
        upload = self.uploading.pop(frame.req_id)
        try:
            following = upload.on_ack(frame)
        except UploadFailed as exc:
            log.warning("media not sent (%s %s): %s", upload.kind, upload.step, exc)
            self.holder.media.drop(upload.key)  # it would be refused again
            return
        if following is None:
            self.holder.media.sent(upload.key)
            log.info("%s sent over the long connection in %d chunk(s)", upload.kind, upload.chunks)
            return
        self.send(following)
        self.uploading[following.req_id] = upload

    def pushed(self, frame: aibot_ws.Frame) -> None:
        """WeCom's answer to a push: sent (never again), or refused (dropped: it would be refused
        again; what it carried went by app message as well)."""
        key = self.pushing.pop(frame.req_id)
        if frame.errcode:
            log.warning("push refused req_id=%s errcode=%s errmsg=%s", frame.req_id, frame.errcode,
                        frame.errmsg)
            self.holder.pushes.drop(key)
        else:
            self.holder.pushes.sent(key)
            log.info("pushed over the long connection req_id=%s", frame.req_id)

    # -- stream frames to WeCom ----------------------------------------------------------------
    def pump(self) -> None:
        """Push every owed stream whose text changed since the last frame; finish the done; send
        the messages the bot writes first."""
        holder = self.holder
        self.push_waiting()
        self.upload_waiting()
        try:
            owed = holder.pending.all()
        except redis.RedisError as exc:
            log.warning("pending streams unavailable: %s", type(exc).__name__)
            return
        for stream_id, entry in owed.items():
            req_id = entry.get("req_id")
            if not req_id:
                holder.pending.remove(stream_id)
                continue
            last = self.sent.setdefault(stream_id, _Sent())
            if last.finish:
                continue  # waiting for WeCom's ack
            try:
                reply = aibot_callback.refresh(stream_id, holder.services)["stream"]
            except (CallbackRejected, redis.RedisError) as exc:
                log.warning("stream state unavailable, retried: %s", type(exc).__name__)
                continue
            if reply["content"] == last.content and not reply["finish"]:
                continue
            if reply["finish"] and not reply["content"] and self.unwritten(stream_id):
                # A holder died between owing the stream and writing its row: nothing to answer
                # with. WeCom pushes an unanswered message again, and it is asked then.
                log.info("owed stream without a row dropped req_id=%s", req_id)
                holder.pending.remove(stream_id)
                self.sent.pop(stream_id, None)
                self.offered.pop(stream_id, None)
                continue
            offered = self.offered.pop(stream_id, None) if last.content is None else None
            self.send(aibot_ws.respond_stream(req_id, stream_id, reply["content"], reply["finish"],
                                              feedback_id=offered))
            self.unacked[req_id] = self.unacked.get(req_id, 0) + 1
            last.content, last.finish = reply["content"], reply["finish"]
            if reply["finish"]:
                self.finished[req_id] = stream_id
                log.info("stream finished over the long connection req_id=%s", req_id)


class Holder:
    """Contend for the lease; while holding it, keep one subscribed WebSocket to WeCom."""

    def __init__(self, services, connect=None, stopping: threading.Event | None = None):
        s = services.settings
        if not s.aibot_ws_enabled:
            raise ValueError("the long connection needs AIBOT_BOT_ID and AIBOT_SECRET")
        self.services = services
        self.settings = s
        self.stopping = stopping or threading.Event()
        self.lease = Lease(services.redis, s.aibot_ws_lease_s)
        self.pending = Pending(services.redis)
        self.pushes = Pushes(services.redis)
        self.media = MediaPushes(services.redis)
        self.backoff = aibot_ws.Backoff(1.0, s.aibot_ws_backoff_max_s)
        self.keeper: LeaseKeeper | None = None
        self._connect = connect or _connect

    def run(self) -> None:
        log.info("long connection service started url=%s bot_id=%s", self.settings.aibot_ws_url,
                 self.settings.aibot_bot_id)
        while not self.stopping.is_set():
            try:
                held = self.lease.acquire()
            except redis.RedisError as exc:
                log.warning("lease unavailable: %s", type(exc).__name__)
                held = False
            if not held:
                self.stopping.wait(ACQUIRE_EVERY_S)
                continue
            log.info("connection lease acquired holder=%s", self.lease.token)
            self.keeper = LeaseKeeper(self.lease, self.stopping)
            self.keeper.start()
            try:
                self.hold()
            finally:
                self.keeper.done.set()
                self.keeper.join(5)
                if self.stopping.is_set() or not self.keeper.lost.is_set():
                    self.lease.release()
        log.info("long connection service stopped")

    def hold(self) -> None:
        """Connect, subscribe and serve; reconnect with backoff while the lease is ours."""
        keeper = self.keeper
        while not (self.stopping.is_set() or keeper.lost.is_set() or not self.lease.fresh()):
            subscribed = False
            try:
                with self._connect(self.settings.aibot_ws_url) as ws:
                    session = Session(self, ws, aibot_ws.Heartbeat(self.settings.aibot_ws_heartbeat_s))
                    session.subscribe(self.settings.aibot_bot_id, self.settings.aibot_secret.get_secret_value())
                    subscribed = True
                    self.backoff.reset()
                    log.info("subscribed to WeCom's long connection")
                    session.loop()
            except ConnectionClosed as exc:
                log.info("long connection closed: %s", exc)
            except (OSError, TimeoutError, _ws_errors(), redis.RedisError, SQLAlchemyError) as exc:
                log.warning("long connection failed: %s", type(exc).__name__)
            if self.stopping.is_set() or keeper.lost.is_set() or not self.lease.fresh():
                return
            delay = self.backoff.next()  # after a subscription: short (the backoff was reset)
            log.info("reconnecting in %.1f s (subscribed before: %s)", delay, subscribed)
            if self.stopping.wait(delay):
                return


def _ws_errors():
    from websockets.exceptions import WebSocketException

    return WebSocketException


def _connect(url: str):
    from websockets.sync.client import connect

    return connect(url, open_timeout=10, close_timeout=2, max_size=aibot_ws.MAX_FRAME_BYTES,
                   user_agent_header="wecom-glm-bot")


def check(settings) -> int:
    """The container's health check: 0 when some replica holds the connection (or it is off)."""
    if not settings.aibot_ws_enabled:
        return 0
    try:
        client = redis_client.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
        return 0 if client.exists(LEASE_KEY) else 1
    except redis.RedisError:
        return 1


def main(argv: list[str] | None = None) -> int:
    import sys

    from app import logging_setup
    from app.config import get_settings
    from app.services import Services

    argv = sys.argv[1:] if argv is None else argv
    settings = get_settings()
    if argv[:1] == ["check"]:
        return check(settings)
    logging_setup.configure(settings)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    if not settings.aibot_ws_enabled:
        # Idle rather than exit, so that a supervisor's restart policy does not loop on it.
        log.info("the AI bot's long connection is off (AIBOT_BOT_ID and AIBOT_SECRET unset)")
        stopping.wait()
        return 0
    Holder(Services(settings), stopping=stopping).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
