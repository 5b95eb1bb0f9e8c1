"""The WXBizMsgCrypt callback protocol, byte-compatible with WeCom's own sample.

* signature = sha1 of the lexically sorted concatenation of token, timestamp, nonce, encrypt;
* AES key = base64decode(EncodingAESKey + "="), 32 bytes; AES-256-CBC with IV = key[:16];
* PKCS#7 padding to a multiple of 32 bytes (not AES's 16: WeCom's choice);
* plaintext = 16 random bytes + 4-byte big-endian length + message + receive id.

The receive id is the CorpID for a self-built app and "" for the AI-bot channel. This module does
crypto and nothing else: parsing the decrypted message is ``messages.py``'s job.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import struct

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from app.wecom import xmlparse
from app.wecom.exceptions import (
    ComputeSignatureError,
    DecodeBase64Error,
    DecryptAesError,
    IllegalAesKeyError,
    IllegalBufferError,
    ParseXmlError,
    ValidateCorpIdError,
    ValidateSignatureError,
)

BLOCK_SIZE = 32
# WeCom's echostr is a random number (19 digits in every published vector). Only a short token
# of letters and digits is echoed: the same key encrypts every message, so echoing whatever
# decrypts would hand back a captured message's XML (or an AI bot's JSON) as plaintext.
ECHOSTR_PLAINTEXT = re.compile(rb"[0-9A-Za-z_-]{1,64}")
_REPLY_TEMPLATE = (
    "<xml>\n<Encrypt><![CDATA[{encrypt}]]></Encrypt>\n"
    "<MsgSignature><![CDATA[{signature}]]></MsgSignature>\n"
    "<TimeStamp>{timestamp}</TimeStamp>\n<Nonce><![CDATA[{nonce}]]></Nonce>\n</xml>"
)


def decode_aes_key(encoding_aes_key: str) -> bytes:
    """Turn the 43-character EncodingAESKey into the 32-byte AES key, or raise -40004."""
    if not isinstance(encoding_aes_key, str) or len(encoding_aes_key) != 43:
        raise IllegalAesKeyError("EncodingAESKey must be 43 characters")
    try:
        key = base64.b64decode(encoding_aes_key + "=", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise IllegalAesKeyError("EncodingAESKey is not base64") from exc
    if len(key) != 32:
        raise IllegalAesKeyError("EncodingAESKey must decode to 32 bytes")
    return key


def pkcs7_pad(data: bytes) -> bytes:
    pad = BLOCK_SIZE - len(data) % BLOCK_SIZE
    return data + bytes([pad]) * pad


def pkcs7_unpad(data: bytes) -> bytes:
    """Strip WeCom's padding; reject anything but 1..32 identical pad bytes."""
    if not data:
        raise IllegalBufferError("empty plaintext")
    pad = data[-1]
    if not 1 <= pad <= BLOCK_SIZE or data[-pad:] != bytes([pad]) * pad:
        raise IllegalBufferError("bad padding")
    return data[:-pad]


def sign(token: str, timestamp: str, nonce: str, encrypt: str) -> str:
    """WeCom's msg_signature."""
    try:
        parts = sorted([str(token), str(timestamp), str(nonce), str(encrypt)])
        return hashlib.sha1("".join(parts).encode()).hexdigest()  # noqa: S324 - protocol-mandated
    except Exception as exc:  # pragma: no cover - str() of str cannot fail in practice
        raise ComputeSignatureError(str(exc)) from exc


class WeComCrypto:
    """Sign, verify, encrypt and decrypt for one (token, EncodingAESKey, receive id) triple."""

    def __init__(self, token: str, encoding_aes_key: str, receive_id: str):
        self.token = token
        self.key = decode_aes_key(encoding_aes_key)
        self.receive_id = receive_id
        # `cryptography`'s AES keeps the GIL: under a callback's request threads pycryptodome's
        # cffi calls each handed it to another thread (and cost 34 µs a message against 7).
        self._cipher = Cipher(algorithms.AES(self.key), modes.CBC(self.key[:16]))

    # -- signatures ---------------------------------------------------------------------------
    def signature(self, timestamp: str, nonce: str, encrypt: str) -> str:
        return sign(self.token, timestamp, nonce, encrypt)

    def check_signature(self, msg_signature: str, timestamp: str, nonce: str, encrypt: str) -> None:
        """Constant-time comparison, so the signature cannot be found byte by byte. Exact, as
        WeCom sends it (lower-case hex): no other spelling of the digest is accepted."""
        expected = self.signature(timestamp, nonce, encrypt)
        if not hmac.compare_digest(expected.encode(), str(msg_signature or "").encode()):
            raise ValidateSignatureError()

    # -- AES ----------------------------------------------------------------------------------
    def encrypt(self, message: str | bytes, random16: bytes | None = None) -> str:
        """Encrypt a message for WeCom; ``random16`` is fixed only in tests (the sample's vector)."""
        body = message.encode() if isinstance(message, str) else message
        random16 = os.urandom(16) if random16 is None else random16
        if len(random16) != 16:
            raise ValueError("random16 must be 16 bytes")
        plain = random16 + struct.pack(">I", len(body)) + body + self.receive_id.encode()
        encryptor = self._cipher.encryptor()
        return base64.b64encode(encryptor.update(pkcs7_pad(plain)) + encryptor.finalize()).decode()

    def decrypt(self, encrypt: str, receive_id: str | None = None) -> bytes:
        """Decrypt ``Encrypt`` and check the trailing receive id (CorpID); return the message."""
        try:
            raw = base64.b64decode(encrypt, validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise DecodeBase64Error() from exc
        if not raw or len(raw) % 16:
            raise DecryptAesError("ciphertext is not a whole number of AES blocks")
        decryptor = self._cipher.decryptor()
        plain = pkcs7_unpad(decryptor.update(raw) + decryptor.finalize())
        if len(plain) < 20:
            raise IllegalBufferError("plaintext too short")
        (length,) = struct.unpack(">I", plain[16:20])
        if 20 + length > len(plain):
            raise IllegalBufferError("message length exceeds plaintext")
        message, tail = plain[20 : 20 + length], plain[20 + length :]
        expected = self.receive_id if receive_id is None else receive_id
        if not hmac.compare_digest(tail, expected.encode()):
            raise ValidateCorpIdError()
        return message

    # -- the two callback operations ----------------------------------------------------------
    def verify_url(self, msg_signature: str, timestamp: str, nonce: str, echostr: str) -> str:
        """URL verification (GET): check the signature over echostr, return its plaintext, which
        must look like an echostr (``ECHOSTR_PLAINTEXT``), never a message."""
        self.check_signature(msg_signature, timestamp, nonce, echostr)
        plain = self.decrypt(echostr)
        if not ECHOSTR_PLAINTEXT.fullmatch(plain):
            raise IllegalBufferError("plaintext is not an echostr")
        return plain.decode("ascii")

    def decrypt_message(self, post_body: bytes | str, msg_signature: str, timestamp: str,
                        nonce: str) -> str:
        """A POSTed ``<xml><Encrypt/>...</xml>`` envelope to the decrypted message XML."""
        encrypt = extract_encrypt(post_body)
        self.check_signature(msg_signature, timestamp, nonce, encrypt)
        try:
            return self.decrypt(encrypt).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise IllegalBufferError("message is not UTF-8") from exc

    def encrypt_reply(self, reply: str, timestamp: str, nonce: str,
                      random16: bytes | None = None) -> str:
        """A passive reply (or an outbound callback) as WeCom's encrypted XML envelope."""
        encrypt = self.encrypt(reply, random16)
        return _REPLY_TEMPLATE.format(encrypt=encrypt, signature=self.signature(timestamp, nonce, encrypt),
                                      timestamp=timestamp, nonce=nonce)


def extract_encrypt(post_body: bytes | str) -> str:
    """The ``Encrypt`` text of a callback envelope, parsed safely (no entities, no DTDs)."""
    try:
        _, fields = xmlparse.parse(post_body)
    except (xmlparse.XmlRefused, xmlparse.XmlMalformed, TypeError) as exc:
        raise ParseXmlError(type(exc).__name__) from exc
    encrypt = fields.get("Encrypt")
    if not isinstance(encrypt, str) or not encrypt.strip():
        raise ParseXmlError("no Encrypt element")
    return encrypt.strip()


def encrypt_media(key: bytes, data: bytes) -> bytes:
    """The AI bot's encrypted media (an image or file URL's bytes): AES-256-CBC with the bot's
    EncodingAESKey, IV = key[:16], PKCS#7 padded to 32 bytes; no random prefix, no receive id."""
    encryptor = Cipher(algorithms.AES(key), modes.CBC(key[:16])).encryptor()
    return encryptor.update(pkcs7_pad(data)) + encryptor.finalize()


def decrypt_media(key: bytes, data: bytes) -> bytes:
    """The other side of ``encrypt_media``; ``DecryptAesError``/``IllegalBufferError`` when the
    bytes were not encrypted with this key."""
    if not data or len(data) % 16:
        raise DecryptAesError("encrypted media is not whole AES blocks")
    decryptor = Cipher(algorithms.AES(key), modes.CBC(key[:16])).decryptor()
    return pkcs7_unpad(decryptor.update(data) + decryptor.finalize())
