"""What a tool server checks on every call: the bot's identity token (docs/tools.md).

Written from the tool server's side, with PyJWT alone and none of the bot's code, as a company's
own MCP server would be: an Ed25519-signed JWT (``alg`` EdDSA) from the bot's public key, for
this server (``aud``), from the bot (``iss``), unexpired, naming the asker (``sub``) and their
departments. Over HTTP it comes as ``Authorization: Bearer``; over stdio in the request's
``_meta`` under ``IDENTITY_META_KEY``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

IDENTITY_META_KEY = "wecom-bot/identity"  # the bot's name for the token in an MCP request's _meta
LEEWAY_S = 5


class Refused(ValueError):
    """The call proves no asker: missing, forged, expired, for another server."""


@dataclass(frozen=True)
class Caller:
    user_id: str
    departments: tuple[int, ...]


def load_public_key(text: str) -> Ed25519PublicKey:
    """The bot's public key: a SubjectPublicKeyInfo PEM or base64 of the 32 raw bytes."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        key = serialization.load_pem_public_key(text.encode())
    else:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(text + "=" * (-len(text) % 4)))
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key


def bearer(authorization: str | None) -> str:
    scheme, _, value = (authorization or "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def caller_of(token: str, key: Ed25519PublicKey, *, issuer: str, audience: str) -> Caller:
    if not token:
        raise Refused("no identity token")
    try:
        claims = jwt.decode(token, key, algorithms=["EdDSA"], audience=audience, issuer=issuer,
                            leeway=LEEWAY_S, options={"require": ["exp", "iat", "aud", "iss", "sub"]})
    except jwt.ExpiredSignatureError:
        raise Refused("identity token expired") from None
    except jwt.InvalidAudienceError:
        raise Refused("identity token is for another server") from None
    except jwt.PyJWTError as exc:
        raise Refused(f"identity token refused: {type(exc).__name__}") from None
    departments = claims.get("departments") or []
    if not isinstance(departments, list) or not all(isinstance(d, int) for d in departments):
        raise Refused("identity token's departments are malformed")
    return Caller(str(claims["sub"]), tuple(departments))
