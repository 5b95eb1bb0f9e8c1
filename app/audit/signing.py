"""Ed25519 signatures of audit exports: the server signs, anyone with the public key verifies.

An HMAC would let every verifier also forge; with Ed25519 the private key stays with the server
(``AUDIT_EXPORT_KEY``: a PKCS#8 PEM or base64 of the 32-byte seed, or ``AUDIT_EXPORT_KEY_FILE``,
never in the repository) and an outside auditor holds only the public key
(``python -m app.cli audit public-key``), which can check a signature and make none.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALGORITHM = "Ed25519"


class SigningKeyMissing(RuntimeError):
    """No export signing key is configured."""


def private_key_from_text(text: str) -> Ed25519PrivateKey:
    """A PKCS#8 PEM, or base64/hex of the 32-byte seed; ValueError saying which it is not."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        key = serialization.load_pem_private_key(text.encode(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("is a PEM private key, but not an Ed25519 one")
        return key
    try:
        seed = bytes.fromhex(text) if len(text) == 64 else base64.b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("is neither a PEM private key nor base64/hex of a 32-byte seed") from None
    if len(seed) != 32:
        raise ValueError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
    return Ed25519PrivateKey.from_private_bytes(seed)


def signing_key(settings) -> Ed25519PrivateKey:
    if settings.audit_export_key is not None:
        return private_key_from_text(settings.audit_export_key.get_secret_value())
    if settings.audit_export_key_file:
        return private_key_from_text(Path(settings.audit_export_key_file).read_text())
    raise SigningKeyMissing("no key signs audit exports: set AUDIT_EXPORT_KEY or AUDIT_EXPORT_KEY_FILE "
                            "(python -c 'import base64,os;print(base64.b64encode(os.urandom(32)).decode())')")


def public_pem(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.PEM,
                               serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def load_public_key(pem: bytes | str) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(pem.encode() if isinstance(pem, str) else pem)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def canonical(manifest: dict) -> bytes:
    unsigned = {k: v for k, v in manifest.items() if k != "signature"}
    return json.dumps(unsigned, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


def sign(manifest: dict, key: Ed25519PrivateKey) -> str:
    return base64.b64encode(key.sign(canonical(manifest))).decode()


def verify(manifest: dict, public: Ed25519PublicKey) -> bool:
    try:
        public.verify(base64.b64decode(str(manifest.get("signature", "")), validate=True),
                      canonical(manifest))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True
