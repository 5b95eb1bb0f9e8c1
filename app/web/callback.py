"""The WeCom callback URL: ``GET`` verifies it, ``POST`` accepts a message.

A POST is checked (size, signature in constant time, timestamp window, receive id, agent id),
decrypted, parsed, de-duplicated and written to the outbox in one transaction (``app.intake``;
the row is ``app.outbox.rows``); then WeCom is answered with an empty 200, well inside its
5-second limit, and the intake publishes the task (``app.outbox.publisher``). Anything malformed
gets 400/403/413 with a short JSON reason. If the database is down the answer is 503 (WeCom
retries); if Redis is down the row stays queued and the sweeper enqueues it later.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from datetime import UTC, datetime

from flask import Blueprint, Response, current_app, g, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from app.audit.chain import request_fingerprint
from app.intake.protocol import IntakeUnavailable
from app.logging_setup import sensitive
from app.metrics import counters as metrics
from app.outbox import rows
from app.web.body_reader import BodyTooSlow, read_body
from app.wecom.exceptions import (
    ParseXmlError,
    ValidateCorpIdError,
    ValidateSignatureError,
    WeComCryptoError,
)
from app.wecom.messages import MessageParseError, parse_message

log = logging.getLogger(__name__)
bp = Blueprint("wecom", __name__)


class CallbackRejected(Exception):
    """``reason`` is the client's explanation; ``code`` the metric label (``metrics.REJECT_REASONS``)."""

    def __init__(self, status: int, reason: str, code: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.code = code


@bp.errorhandler(CallbackRejected)
def _rejected(exc: CallbackRejected):
    log.info("callback rejected status=%s reason=%s", exc.status, exc.reason)
    metrics.callback("rejected", exc.code)
    return jsonify(error=exc.reason), exc.status


def _services():
    return current_app.extensions["services"]


def _query(*names: str) -> list[str]:
    args = request.args
    values = [args.get(name, "") for name in names]
    missing = [name for name, value in zip(names, values, strict=True) if not value]
    if missing:
        raise CallbackRejected(400, f"missing query parameter: {', '.join(missing)}", "missing_param")
    return values


# Seconds since 1970 in ASCII digits, as WeCom writes them. int() alone would also take a sign,
# spaces, underscores and other scripts' digits, and a 400-digit number that then overflows the
# float arithmetic below (a 500).
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


def check_timestamp(timestamp: str) -> None:
    """Refuse replays: WeCom signs the current time, so an old (or future) one is not WeCom."""
    if not _TIMESTAMP.fullmatch(timestamp):
        raise CallbackRejected(400, "timestamp is not an integer", "bad_timestamp")
    window = _services().settings.callback_timestamp_window_s
    if abs(int(time.time()) - int(timestamp)) > window:
        raise CallbackRejected(403, "timestamp outside the accepted window", "stale_timestamp")


def _crypto_rejection(exc: WeComCryptoError) -> CallbackRejected:
    if isinstance(exc, ValidateSignatureError):
        return CallbackRejected(403, "signature mismatch", "signature")
    if isinstance(exc, ValidateCorpIdError):
        return CallbackRejected(403, "receive id (CorpID) mismatch", "corp_id")
    if isinstance(exc, ParseXmlError):
        return CallbackRejected(400, "malformed xml", "bad_xml")
    return CallbackRejected(400, f"cannot decrypt message ({exc.code})", "decrypt")


@bp.get("/wecom/callback")
def verify_url():
    signature, timestamp, nonce, echostr = _query("msg_signature", "timestamp", "nonce", "echostr")
    check_timestamp(timestamp)  # a replayed verification is refused like a replayed message
    try:
        plain = _services().wecom_crypto.verify_url(signature, timestamp, nonce, echostr)
    except WeComCryptoError as exc:
        raise _crypto_rejection(exc) from None
    return Response(plain, mimetype="text/plain")


def read_signed_body(limit: int) -> tuple[str, str, str, bytes]:
    """The signature, timestamp, nonce and body of a POSTed callback, within size and time limits."""
    length = request.content_length
    if length is not None and length > limit:
        raise CallbackRejected(413, "body too large", "too_large")
    signature, timestamp, nonce = _query("msg_signature", "timestamp", "nonce")
    check_timestamp(timestamp)
    try:
        body = read_body(limit)
    except RequestEntityTooLarge:
        raise CallbackRejected(413, "body too large", "too_large") from None
    except BodyTooSlow:
        raise CallbackRejected(408, "body too slow", "slow_body") from None
    # A body without Content-Length (chunked) is cut at the limit by Werkzeug, not refused, so
    # one that reaches the limit is taken as larger: refused, never parsed truncated.
    if len(body) >= limit:
        raise CallbackRejected(413, "body too large", "too_large")
    return signature, timestamp, nonce, body


@bp.post("/wecom/callback")
def receive():
    services = _services()
    signature, timestamp, nonce, body = read_signed_body(services.settings.callback_max_bytes)
    try:
        xml = services.wecom_crypto.decrypt_message(body, signature, timestamp, nonce)
    except WeComCryptoError as exc:
        raise _crypto_rejection(exc) from None
    try:
        message = parse_message(xml)
    except MessageParseError as exc:
        raise CallbackRejected(400, f"malformed message: {exc}", "bad_message") from None
    if message.agent_id is not None and message.agent_id != services.settings.wecom_agent_id:
        raise CallbackRejected(403, "message is for another agent", "wrong_agent")

    with sensitive(message.from_user, getattr(message, "content", None)):
        try:
            accepted = services.intake.accept(rows.Arrival(message, g.request_id), fingerprint())
        except IntakeUnavailable as exc:
            log.warning("outbox write failed: %s", exc)
            metrics.callback("error", "storage")
            return jsonify(error="storage unavailable, retry later"), 503

    if accepted.created:  # the intake publishes its task
        metrics.callback("accepted")
    else:
        metrics.callback("duplicate")
        log.info("duplicate callback message_id=%s", accepted.id)
    return Response("", status=200, mimetype="text/plain")


def fingerprint() -> str:
    """The request's fingerprint for its audit event (docs/data.md: keyed, by the hour). WeCom calls
    from a few addresses, so the hour's few fingerprints are kept rather than made per callback."""
    return _fingerprint(_services().settings.secret_key.get_secret_value(), request.remote_addr,
                        request.headers.get("User-Agent"), int(time.time()) // 3600)


@functools.lru_cache(maxsize=1024)
def _fingerprint(secret: str, remote_addr: str | None, user_agent: str | None, hour: int) -> str:
    return request_fingerprint(secret, remote_addr, user_agent, datetime.fromtimestamp(hour * 3600, UTC))

