"""The 智能机器人 (AI bot) callback URL, ``/wecom/aibot``: a second channel beside the app's.

``GET`` verifies the URL; ``POST`` carries ``{"encrypt": ...}`` (signature, timestamp window and
decryption with receive id "" as for the app, see ``app/wecom/aibot.py``). A question is written
to the outbox (channel ``aibot``, dedup by msgid) with a fresh stream id, enqueued, and answered
at once with that stream, unfinished; WeCom then polls the stream with refresh callbacks, each
answered from Redis with the text the worker has produced so far (``app/aibot/streams.py``),
until a reply says ``finish``. In a group chat the bot answers only when @mentioned.

Bad JSON is a 400, a bad signature a 403, like the app's callback; an unknown stream id gets a
finished empty stream, never an error, so WeCom stops polling it.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time

import redis
from flask import Blueprint, Response, current_app, g, jsonify
from sqlalchemy.exc import SQLAlchemyError

from app.aibot.streams import EXPIRED_NOTICE, TRUNCATED_NOTICE
from app.feedback import ratings as feedback
from app.intake.protocol import IntakeUnavailable
from app.metrics import counters as metrics
from app.models import MessageStatus
from app.outbox import rows
from app.outbox.publisher import publish_tasks
from app.web.callback import (
    CallbackRejected,
    _crypto_rejection,
    _query,
    check_timestamp,
    fingerprint,
    read_signed_body,
)
from app.wecom import aibot
from app.wecom.exceptions import MessageParseError, WeComCryptoError

log = logging.getLogger(__name__)
bp = Blueprint("aibot", __name__)
CHANNEL = "aibot"
# The worker finishes a stream itself at the deadline; the callback does only when no worker did.
CALLBACK_GRACE_S = 10.0
UNSUPPORTED_NOTICE = ("目前我只能阅读文字消息，请用文字描述你的问题。\n"
                      "I can only read text messages for now; please type your question.")


@bp.errorhandler(CallbackRejected)
def _rejected(exc: CallbackRejected):
    log.info("aibot callback rejected status=%s reason=%s request_id=%s", exc.status, exc.reason,
             g.get("request_id"))
    metrics.callback("rejected", exc.code)
    return jsonify(error=exc.reason), exc.status


def _services():
    return current_app.extensions["services"]


def _crypto():
    crypto = _services().aibot_crypto
    if crypto is None:
        raise CallbackRejected(404, "the AI bot channel is not configured (AIBOT_TOKEN)", "not_configured")
    return crypto


@bp.get("/wecom/aibot")
def verify_url():
    crypto = _crypto()
    signature, timestamp, nonce, echostr = _query("msg_signature", "timestamp", "nonce", "echostr")
    check_timestamp(timestamp)
    try:
        plain = crypto.verify_url(signature, timestamp, nonce, echostr)
    except WeComCryptoError as exc:
        raise _crypto_rejection(exc) from None
    return Response(plain, mimetype="text/plain")


@bp.post("/wecom/aibot")
def receive():
    crypto = _crypto()
    signature, timestamp, nonce, body = read_signed_body(_services().settings.callback_max_bytes)
    try:
        encrypt = aibot.extract_encrypt(body)
    except aibot.AibotRequestError as exc:
        raise CallbackRejected(400, str(exc), "bad_json") from None
    try:
        crypto.check_signature(signature, timestamp, nonce, encrypt)
        message = aibot.parse_message(crypto.decrypt(encrypt), int(time.time()))
    except WeComCryptoError as exc:
        raise _crypto_rejection(exc) from None
    except MessageParseError as exc:
        raise CallbackRejected(400, f"malformed message: {exc}", "bad_message") from None

    reply = answer(message)
    if reply is None:
        return Response("", status=200, mimetype="text/plain")
    return jsonify(aibot.encrypt_reply(crypto, reply, timestamp, nonce))


def answer(message: aibot.AibotMessage) -> dict | None:
    """The reply message for one callback, or None for an empty 200 (nothing to say)."""
    if message.msg_type == "stream":
        return refresh(message.stream_id)
    if message.msg_type == "event":
        if message.event == "enter_chat":
            return aibot.text_message(_services().settings.welcome_message)
        if message.event == aibot.FEEDBACK_EVENT:
            try:
                accept_feedback(_services(), message, g.request_id, fingerprint())
            except IntakeUnavailable as exc:
                log.warning("outbox write failed request_id=%s: %s", g.request_id, exc)
                raise CallbackRejected(503, "storage unavailable, retry later", "storage") from None
        return None
    if message.msg_type not in aibot.QUESTION_TYPES:
        return aibot.stream_message(new_stream_id(), UNSUPPORTED_NOTICE, True)
    return question(message)


def new_stream_id() -> str:
    return secrets.token_urlsafe(16)


def question(message: aibot.AibotMessage) -> dict | None:
    services = _services()
    asked = askable(message, services.settings)
    if not isinstance(asked, aibot.AibotMessage):
        if asked is None:
            log.info("group message without @mention ignored request_id=%s", g.request_id)
        return asked
    try:
        accepted = submit(services, asked, g.request_id, fingerprint(), new_stream_id())
    except IntakeUnavailable as exc:
        log.warning("outbox write failed request_id=%s: %s", g.request_id, exc)
        raise CallbackRejected(503, "storage unavailable, retry later", "storage") from None
    offered = feedback_of(services, asked, accepted.id)
    if not accepted.created:
        log.info("duplicate aibot callback message_id=%s request_id=%s", accepted.id, g.request_id)
        # WeCom asks again because our first reply never reached it: this one is its first
        reply = refresh(accepted.stream_id)
        if offered:
            reply["stream"]["feedback"] = {"id": offered}
        return reply
    return aibot.stream_message(accepted.stream_id, services.settings.aibot_thinking_text, False,
                                feedback_id=offered)


def feedback_of(services, asked: aibot.AibotMessage, message_id: int) -> str | None:
    """The ``feedback.id`` the first reply to this question carries (WeCom's 👍/👎 under the
    answer), or None (feedback off, or a command: no model answer to rate)."""
    if not feedback.offers_feedback(services.settings, asked.content):
        return None
    return feedback.feedback_id(services.blind_index, message_id)


def accept_feedback(services, message: aibot.AibotMessage, request_id: str | None,
                    fingerprint_: str | None) -> rows.Accepted | None:
    """A ``feedback_event`` (callback or long connection) into the outbox, where its msgid drops
    WeCom's second delivery and the worker records it (``worker/feedback.py``); a malformed one
    is logged and dropped (None). ``IntakeUnavailable`` when the write failed."""
    problem = feedback.aibot_problem(message)
    if problem is not None:
        log.warning("aibot feedback_event ignored: %s", problem)
        return None
    accepted = services.intake.accept(rows.Arrival(message, request_id, CHANNEL), fingerprint_)
    log.info("aibot feedback_event %s message_id=%s", "accepted" if accepted.created else "duplicate",
             accepted.id)
    return accepted


def askable(message: aibot.AibotMessage, settings) -> aibot.AibotMessage | dict | None:
    """The question as the model gets it (a group's @mention stripped); or a finished reply
    for what cannot be asked; or None when there is nothing to say (a group message not
    addressed to the bot, an empty text). Both the callback and the long connection use it."""
    content = message.content or ""
    if message.is_group:
        content = aibot.strip_mention(content, settings.aibot_name)
        if content is None:
            return None
    if not content.strip() and not (message.image_urls or message.file_url):  # worker/media/
        if message.msg_type == "mixed":
            return aibot.stream_message(new_stream_id(), UNSUPPORTED_NOTICE, True)
        return None
    return dataclasses.replace(message, content=content)


def submit(services, message: aibot.AibotMessage, request_id: str | None, fingerprint_: str | None,
           stream_id: str) -> rows.Accepted:
    """Write the question to the outbox (dedup by msgid: a retry, or the same message by the
    other channel or another replica, finds the first row and its stream), open a new row's
    stream and publish its task; ``IntakeUnavailable`` when the write failed."""
    accepted = services.intake.accept(
        rows.Arrival(message, request_id, CHANNEL, stream_id, enqueue=False), fingerprint_)
    if not accepted.created:
        return accepted
    try:
        services.streams.open(accepted.stream_id, accepted.id, time.time())
    except redis.RedisError:  # refreshes fall back to the outbox row until the worker writes
        log.warning("stream not opened in Redis message_id=%s", accepted.id)
    # after the stream exists, which the worker writes to
    publish_tasks(services.publisher, [(accepted.id, request_id)])
    return accepted


def refresh(stream_id: str, services=None) -> dict:
    """WeCom's poll: the stream's text so far, finished when the answer is complete (the long
    connection asks the same for the streams it pushes, with its own ``services``)."""
    services = services or _services()
    settings = services.settings
    try:
        state = services.streams.get(stream_id)
    except redis.RedisError:
        log.warning("stream state unavailable, answering from the outbox")
        state = None
    if state is None:
        return aibot.stream_message(stream_id, *_from_outbox(stream_id, services))
    if state.finished:
        return aibot.stream_message(stream_id, state.text, True)
    if state.age_s() > settings.aibot_stream_deadline_s + CALLBACK_GRACE_S:
        text = state.text + TRUNCATED_NOTICE if state.text else EXPIRED_NOTICE
        try:
            if not services.streams.write(stream_id, state.message_id, state.started, text, True):
                text = services.streams.get(stream_id).text  # the worker finished it just now
        except redis.RedisError:
            log.warning("stream not closed in Redis message_id=%s", state.message_id)
        log.warning("stream closed by the callback at the deadline message_id=%s", state.message_id)
        return aibot.stream_message(stream_id, text, True)
    return aibot.stream_message(stream_id, state.text or settings.aibot_thinking_text, False)


def _from_outbox(stream_id: str, services) -> tuple[str, bool]:
    """(content, finish) from the durable row, when Redis has no state for the stream."""
    settings = services.settings
    try:
        with services.db.session() as session:
            row = rows.by_stream_id(session, stream_id)
            if row is not None:
                session.expunge(row)
    except SQLAlchemyError:
        log.exception("outbox read failed stream_id=%s", stream_id)
        raise CallbackRejected(503, "storage unavailable, retry later", "storage") from None
    if row is None:
        return "", True  # not ours, or long gone: finished, so WeCom stops asking
    if row.status == MessageStatus.ANSWERED and row.reply_enc:
        return services.cipher.decrypt(row.reply_enc, rows.TABLE, "reply_enc", row.id), True
    if row.status in MessageStatus.FINAL:
        return ("" if row.status == MessageStatus.IGNORED else EXPIRED_NOTICE), True
    if time.time() - row.created_at.timestamp() > settings.aibot_stream_deadline_s + CALLBACK_GRACE_S:
        return EXPIRED_NOTICE, True
    return settings.aibot_thinking_text, False
