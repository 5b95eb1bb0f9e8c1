"""WeCom errors.

Two families: the callback crypto errors of WeCom's WXBizMsgCrypt sample (negative codes
-40001..-40011, raised while verifying/decrypting what WeCom sends us) and the errcodes of
WeCom's HTTP API (positive codes, raised by the API client).
"""

from __future__ import annotations

import re


class WeComCryptoError(Exception):
    """A callback failed a WXBizMsgCrypt check; ``code`` is WeCom's sample error code."""

    code = -40000
    reason = "crypto error"

    def __init__(self, detail: str | None = None):
        super().__init__(detail or self.reason)
        self.detail = detail or self.reason


class ValidateSignatureError(WeComCryptoError):
    code, reason = -40001, "signature mismatch"


class ParseXmlError(WeComCryptoError):
    code, reason = -40002, "malformed xml"


class ComputeSignatureError(WeComCryptoError):
    code, reason = -40003, "cannot compute signature"


class IllegalAesKeyError(WeComCryptoError):
    code, reason = -40004, "illegal EncodingAESKey"


class ValidateCorpIdError(WeComCryptoError):
    code, reason = -40005, "receive id (CorpID) mismatch"


class EncryptAesError(WeComCryptoError):
    code, reason = -40006, "aes encryption failed"


class DecryptAesError(WeComCryptoError):
    code, reason = -40007, "aes decryption failed"


class IllegalBufferError(WeComCryptoError):
    code, reason = -40008, "illegal plaintext buffer"


class EncodeBase64Error(WeComCryptoError):
    code, reason = -40009, "base64 encoding failed"


class DecodeBase64Error(WeComCryptoError):
    code, reason = -40010, "base64 decoding failed"


class GenReturnXmlError(WeComCryptoError):
    code, reason = -40011, "cannot build reply xml"


class WeComAPIError(Exception):
    """WeCom's HTTP API answered a non-zero errcode."""

    def __init__(self, errcode: int, errmsg: str = "", response: dict | None = None):
        super().__init__(f"WeCom API error {errcode}: {errmsg}")
        self.errcode = errcode
        self.errmsg = errmsg
        self.response = response or {}

    #: Set by ``WeComClient.send_text``/``send_markdown`` on the way out: how many chunks of the
    #: answer were delivered before this error, so a retrying task can resume after them.
    chunks_sent: int = 0


class WeComTransientError(WeComAPIError):
    """Worth retrying later, with backoff: 5xx, connection errors, timeouts, -1 (system busy),
    45009 (rate limit). ``errcode`` is None when no WeCom answer was read at all.

    The client itself never retries these: a send whose answer was lost may have been delivered,
    and only the caller (a Celery task with bounded retries) knows how long it may wait.
    ``rate_limited``: WeCom refused the call for its frequency limits (45009, or HTTP 429), so
    retrying within the same minute cannot succeed. ``retry_after``: seconds the server asked
    for (an HTTP ``Retry-After``), or None; 45009 names no wait, only the limits' windows do.
    """

    def __init__(self, errcode: int | None, errmsg: str = "", response: dict | None = None,
                 retry_after: float | None = None, rate_limited: bool = False):
        super().__init__(errcode, errmsg, response)  # type: ignore[arg-type]
        if errcode is None:
            self.args = (f"WeCom not reachable: {errmsg}",)
        self.retry_after = retry_after
        self.rate_limited = rate_limited or errcode == RATE_LIMIT_ERRCODE


class UntrustedIPError(WeComAPIError):
    """60020: the server's egress IP is not on the app's trusted IP list (企业可信IP).

    Retrying cannot help; an admin must add ``ip`` (as WeCom saw it, when it says) in the admin
    console: 应用管理 -> the app -> 企业可信IP.
    """

    def __init__(self, errcode: int, errmsg: str = "", response: dict | None = None):
        super().__init__(errcode, errmsg, response)
        match = re.search(r"from ip:\s*([0-9A-Fa-f.:]+)", errmsg or "")
        self.ip = match.group(1) if match else None
        where = f"IP {self.ip}" if self.ip else "this server's public egress IP"
        self.args = (
            f"WeCom API error 60020: {where} is not on the app's trusted IP list. An admin must "
            "add it under WeCom admin console > 应用管理 > this app > 企业可信IP (trusted IPs); "
            "retrying will not help.",
        )


class NoValidReceiverError(WeComAPIError):
    """81013: none of the receivers exists or may be reached by this app (visible range/licence)."""


class InvalidUserError(WeComAPIError):
    """The receiver is unknown to WeCom (``invaliduser`` of message/send, 40003, 60111)."""

    def __init__(self, errcode: int, errmsg: str = "", response: dict | None = None,
                 users: list[str] | None = None):
        super().__init__(errcode, errmsg, response)
        self.users = users or []


class UnlicensedUserError(InvalidUserError):
    """The receiver is in the app's visible range but has no basic licence (``unlicenseduser``)."""


class InvalidMediaError(WeComAPIError):
    """40007 invalid media_id: unknown, or expired (a media_id lives 3 days): ask for it again."""


class MediaRejectedError(WeComAPIError):
    """media/get answered bytes the caller will not take: over its size limit, or not of the
    content type it expects (``errcode`` -2: no WeCom errcode, the client's own refusal)."""

    def __init__(self, errmsg: str, *, too_large: bool = False):
        super().__init__(-2, errmsg, {})
        self.too_large = too_large


class InvalidContentError(WeComAPIError):
    """44004 (empty text content) or 45002 (content over WeCom's size limit): fix the message."""


#: Errcodes that mean "this access_token is not (or no longer) valid": refresh once, then retry.
TOKEN_ERRCODES = frozenset({40001, 40014, 42001, 42007, 42009})
#: 45009 接口调用超过限制 (api freq out of limit). WeCom's frequency limits (主动调用频率限制,
#: developer.work.weixin.qq.com/document/path/90312) are counted per minute and per hour: per
#: corp and per IP for each API, and for message/send per app and member (30 a minute, 1000 an
#: hour) besides the daily total (account limit x 200). The answer names no wait.
RATE_LIMIT_ERRCODE = 45009
#: Errcodes that say "later": -1 system busy, 45009 API call frequency limit.
TRANSIENT_ERRCODES = frozenset({-1, RATE_LIMIT_ERRCODE})

_ERRCODE_CLASSES: dict[int, type[WeComAPIError]] = {
    60020: UntrustedIPError,
    81013: NoValidReceiverError,
    40003: InvalidUserError,
    60111: InvalidUserError,
    40007: InvalidMediaError,
    44004: InvalidContentError,
    45002: InvalidContentError,
}


def api_error(errcode: int, errmsg: str = "", response: dict | None = None) -> WeComAPIError:
    """The exception for one non-zero WeCom errcode (token codes included: the caller decides)."""
    if errcode in TRANSIENT_ERRCODES:
        return WeComTransientError(errcode, errmsg, response)
    return _ERRCODE_CLASSES.get(errcode, WeComAPIError)(errcode, errmsg, response)


class MessageParseError(ValueError):
    """A decrypted callback is not a WeCom message we can read: bad XML or a required field missing."""
