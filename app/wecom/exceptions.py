"""WeCom errors.

Two families: the callback crypto errors of WeCom's WXBizMsgCrypt sample (negative codes
-40001..-40011, raised while verifying/decrypting what WeCom sends us) and the errcodes of
WeCom's HTTP API (positive codes, raised by the API client).
"""

from __future__ import annotations


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
