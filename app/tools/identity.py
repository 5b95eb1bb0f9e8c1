"""The asker's identity as a tool server can trust it: a short-lived Ed25519-signed JWT.

The model never writes who is asking: every tool call carries a token the bot signs with
``TOOLS_SIGNING_KEY``, its ``sub`` the WeCom userid, ``departments`` theirs, ``aud`` the server's
registered name (a token for one server is refused by another), ``exp`` ~60 s ahead, and a
random ``jti`` a server may remember to refuse a replay. Over HTTP it is the ``Authorization:
Bearer`` header; over stdio, the request's ``_meta`` under ``IDENTITY_META_KEY``.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALGORITHM = "EdDSA"
IDENTITY_META_KEY = "wecom-bot/identity"
LEEWAY_S = 5


class IdentityError(ValueError):
    """A token that does not prove who is asking (missing, forged, expired, for another server)."""


@dataclass(frozen=True)
class Asker:
    user_id: str
    departments: tuple[int, ...]
    jti: str = ""


def signing_key(settings) -> Ed25519PrivateKey | None:
    """``TOOLS_SIGNING_KEY`` (or the PEM in ``TOOLS_SIGNING_KEY_FILE``), None when neither is set."""
    from app.audit.signing import private_key_from_text

    if settings.tools_signing_key is not None:
        return private_key_from_text(settings.tools_signing_key.get_secret_value())
    if settings.tools_signing_key_file:
        return private_key_from_text(Path(settings.tools_signing_key_file).read_text())
    return None


def public_pem(key: Ed25519PrivateKey) -> str:
    """The public half a tool server verifies with."""
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def public_key_from_text(text: str) -> Ed25519PublicKey:
    """A SubjectPublicKeyInfo PEM or base64 of the 32 raw bytes."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        key = serialization.load_pem_public_key(text.encode())
    else:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(text + "=" * (-len(text) % 4)))
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key


def issue(key: Ed25519PrivateKey, *, issuer: str, audience: str, user_id: str,
          departments: tuple[int, ...] | list[int], ttl_s: int = 60, now: float | None = None) -> str:
    """A token for one call to the server named ``audience``."""
    at = int(now if now is not None else time.time())
    claims = {"iss": issuer, "aud": audience, "sub": user_id,
              "departments": [int(d) for d in departments], "iat": at, "nbf": at - 1,
              "exp": at + int(ttl_s), "jti": uuid.uuid4().hex}
    return jwt.encode(claims, key, algorithm=ALGORITHM)


def verify(token: str, public_key: Ed25519PublicKey, *, issuer: str, audience: str) -> Asker:
    """The asker a token names, or ``IdentityError`` saying why it is refused (what a tool
    server does with every call: ``emulator/mcp_server.py``)."""
    if not token:
        raise IdentityError("no identity token")
    try:
        claims = jwt.decode(token, public_key, algorithms=[ALGORITHM], audience=audience,
                            issuer=issuer, leeway=LEEWAY_S,
                            options={"require": ["exp", "iat", "aud", "iss", "sub", "jti"]})
    except jwt.ExpiredSignatureError:
        raise IdentityError("identity token expired") from None
    except jwt.InvalidAudienceError:
        raise IdentityError("identity token is for another server") from None
    except jwt.PyJWTError as exc:
        raise IdentityError(f"identity token refused: {type(exc).__name__}") from None
    departments = claims.get("departments") or []
    if not isinstance(departments, list) or not all(isinstance(d, int) for d in departments):
        raise IdentityError("identity token's departments are malformed")
    return Asker(str(claims["sub"]), tuple(departments), str(claims["jti"]))


def bearer_of(authorization: str | None) -> str:
    """The token in an ``Authorization: Bearer ...`` header ("" when there is none)."""
    scheme, _, value = (authorization or "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""
