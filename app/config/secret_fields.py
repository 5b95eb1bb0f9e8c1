"""Which settings hold secrets, how strong each must be, and what the logs must never show.

A secret setting says so in its annotation: ``wecom_token: Annotated[SecretStr, SHARED]``. The
marker (a ``Secret``) carries the setting's strength rule, checked when the settings load (a
weak value stops start-up with a message naming the variable, never the value), and how to find
the values inside it that a log line could show (each key of a ring, a URL's password).
``secret_values(settings)`` walks the markers: it is the logs' redaction list
(``app.logging_setup.configure``), so a new secret setting is redacted and checked by being
marked, and tests/app/test_config.py fails a setting whose name says token, key, secret or
password, or whose type is ``SecretStr``, without a marker.

Strength rules, by who makes the value:

- ours, random bytes (``RANDOM``, ``BLIND_INDEX``, ``KEYRING``, ``AES_KEY``, ``SIGNING_KEY``):
  decoded, long enough, and not a pattern (``refuse_low_entropy``);
- shared secrets a person or another system makes: WeCom's token and secrets (the console's
  random values), API keys of model servers, the metrics token (``SHARED``): at least
  ``SHARED_MIN_CHARS`` characters, not a placeholder, not a pattern (one character or a short
  run repeated, an alphabet or digit sequence); ``PREVIOUS_KEYS``: each an earlier SECRET_KEY,
  which had to have 32 characters at least;
- a URL's password (``URL``): redacted only; its server decides how strong it must be.
"""

from __future__ import annotations

import base64
import binascii
import string
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import SecretStr
from pydantic.fields import FieldInfo

# Words of the placeholders examples and tutorials ship ("replace-with-...", "change-me", ...).
# .env.example's old SECRET_KEY placeholder passed the length check, and anyone who read the
# repository could then sign an admin session cookie.
PLACEHOLDER_WORDS = ("replace", "changeme", "change-me", "change_me", "example", "placeholder",
                     "your-", "your_", "xxxxxx", "0123456789abcdef", "abcdefghijklmnop")
MIN_SECRET_BYTES = 32
SHARED_MIN_CHARS = 16  # WeCom's console makes 32; a typed token may be shorter, not this short
GENERATE_HINT = "python -c 'import secrets; print(secrets.token_urlsafe(48))'"
SECRET_QUERY_NAMES = ("key", "token", "secret", "password", "sentinel_password", "access_token")


# -- strength rules -----------------------------------------------------------------------------------
def refuse_placeholder(value: str) -> None:
    lowered = value.lower()
    if any(word in lowered for word in PLACEHOLDER_WORDS):
        raise ValueError("is a placeholder, not a secret")


def refuse_low_entropy(key: bytes) -> None:
    """Random bytes, not a pattern: 32 random bytes have ~30 distinct values (fewer than 16 has
    odds below 1e-15) and never shrink under zlib; a repeated or constant key does both."""
    if len(set(key)) < 16 or len(zlib.compress(key, 9)) < len(key):
        raise ValueError("is not random (a repeating or constant pattern)")


def is_pattern(text: str) -> bool:
    """A few characters repeated, a run repeated, or a sequence ("abcdefgh...", "1234...").
    Random text of 16 characters or more is none of these (16 random hex digits have fewer than
    6 distinct ones about 3 times in 100,000)."""
    if len(set(text)) < 6:
        return True
    # The shortest period (prefix function): "abcdefabcdefabcd" repeats every 6.
    border, fail = 0, [0] * len(text)
    for i in range(1, len(text)):
        while border and text[i] != text[border]:
            border = fail[border - 1]
        if text[i] == text[border]:
            border += 1
        fail[i] = border
    if len(text) - fail[-1] <= len(text) // 2:
        return True
    return len({ord(b) - ord(a) for a, b in zip(text, text[1:], strict=False)}) <= 2


def check_shared_secret(value: str, min_chars: int = SHARED_MIN_CHARS) -> None:
    """A secret a person or another system made: long enough, not a placeholder or a pattern."""
    refuse_placeholder(value)
    text = value.strip()
    if len(text) < min_chars:
        raise ValueError(f"is too short: at least {min_chars} characters of random text, got "
                         f"{len(text)} (make one with {GENERATE_HINT}; WeCom's console makes its own)")
    if is_pattern(text):
        raise ValueError("is a pattern, not a secret (a character or a run repeated, or a sequence)")


def decode_random_secret(value: str) -> bytes:
    """The bytes of a generated secret: hex, or base64 (standard or URL-safe, padded or not),
    at least ``MIN_SECRET_BYTES`` of them, random-looking; ValueError naming what is wrong."""
    refuse_placeholder(value)
    text = value.strip()
    try:
        if len(text) % 2 == 0 and all(c in string.hexdigits for c in text):
            raw = bytes.fromhex(text)
        else:
            raw = base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4),
                                   validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"must be random bytes in hex or base64, e.g. {GENERATE_HINT}") from None
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(f"must be at least {MIN_SECRET_BYTES} random bytes (hex or base64), "
                         f"e.g. {GENERATE_HINT}")
    refuse_low_entropy(raw)
    return raw


def split_list(spec: str) -> list[str]:
    """``"NEW,OLD"`` (or one a line) -> [NEW, OLD]."""
    return [k.strip() for k in spec.replace("\n", ",").split(",") if k.strip()]


def split_blind_index_keys(spec: str) -> list[str]:
    """``"NEW,OLD"`` -> [NEW, OLD]: BLIND_INDEX_KEY's keyring, current first, each a random secret
    (placeholders and low-entropy values refused for every one, as for a single key)."""
    keys = split_list(spec)
    if not keys:
        raise ValueError("must not be empty")
    for number, key in enumerate(keys, 1):
        try:
            decode_random_secret(key)
        except ValueError as exc:
            raise ValueError(f"key {number} {exc}" if len(keys) > 1 else str(exc)) from None
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice")
    return keys


def check_previous_keys(spec: str) -> None:
    """SECRET_KEY_PREVIOUS: each an earlier SECRET_KEY (32 characters at least, even before
    SECRET_KEY had to be random bytes), none a placeholder or a pattern."""
    for number, key in enumerate(split_list(spec), 1):
        try:
            check_shared_secret(key, min_chars=MIN_SECRET_BYTES)
        except ValueError as exc:
            raise ValueError(f"key {number} {exc}") from None


def _decode_data_key(kid: str, value: str) -> bytes:
    try:
        key = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"key {kid!r} is not base64") from exc
    if len(key) != 32:
        raise ValueError(f"key {kid!r} must be 32 bytes (AES-256), got {len(key)}")
    try:
        refuse_low_entropy(key)
    except ValueError as exc:
        raise ValueError(f"key {kid!r} {exc}") from None
    return key


def parse_keyring(spec: str) -> dict[str, bytes]:
    """``"k2:BASE64,k1:BASE64"`` -> ordered {key id: 32-byte key}; the first one is primary."""
    keys: dict[str, bytes] = {}
    for item in split_list(spec):
        kid, sep, value = item.partition(":")
        if not sep or not kid.isalnum() or len(kid) > 16:
            raise ValueError("entries must look like 'keyid:base64key' (key id alphanumeric, <= 16)")
        if kid in keys:
            raise ValueError(f"key id {kid!r} appears twice")
        keys[kid] = _decode_data_key(kid, value.strip())
    if not keys:
        raise ValueError("at least one key is required")
    return keys


def check_encoding_aes_key(raw: str) -> None:
    """WeCom's EncodingAESKey: 43 characters, base64 of 32 random bytes."""
    if len(raw) != 43:
        raise ValueError(f"must be the 43-character EncodingAESKey (got {len(raw)} characters)")
    try:
        key = base64.b64decode(raw + "=", validate=True)
        if len(key) != 32:
            raise ValueError
    except (binascii.Error, ValueError) as exc:
        raise ValueError("is not a valid EncodingAESKey (base64 of 32 bytes)") from exc
    refuse_placeholder(raw)
    refuse_low_entropy(key)


def check_signing_key(raw: str) -> None:
    """An Ed25519 key (PKCS#8 PEM or the seed's base64/hex) whose seed is random."""
    from cryptography.hazmat.primitives import serialization

    from app.audit.signing import private_key_from_text

    key = private_key_from_text(raw)
    refuse_low_entropy(key.private_bytes(serialization.Encoding.Raw,
                                         serialization.PrivateFormat.Raw,
                                         serialization.NoEncryption()))


# -- what a log line could show of a secret ---------------------------------------------------------------
def whole(raw: str) -> list[str]:
    return [raw]


def list_parts(raw: str) -> list[str]:
    return [raw, *split_list(raw)]


def keyring_parts(raw: str) -> list[str]:
    """The keyring and each key in it (without its id)."""
    return [raw, *(item.partition(":")[2].strip() for item in split_list(raw))]


def pem_parts(raw: str) -> list[str]:
    """A PEM key and each line of its body (a seed in base64 or hex is one line)."""
    return [raw, *(line.strip() for line in raw.splitlines() if not line.startswith("-----"))]


def url_secrets(url: str) -> list[str]:
    """A URL's password and its secret query values (``sentinel_password=`` of a
    ``redis+sentinel://`` URL, ``key=`` of a webhook): "" for none. A malformed URL fails where
    it is used, not here."""
    try:
        parts = urlsplit(url or "")
        found = [unquote(parts.password or "")]
        query = parse_qsl(parts.query, keep_blank_values=False)
    except ValueError:
        return []
    return found + [value for name, value in query if name.lower() in SECRET_QUERY_NAMES]


# -- the marker -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Secret:
    """Marks a setting that holds a secret (see the module's docstring)."""

    check: Callable[[str], object] | None  # raises ValueError; None: not checked (a URL's)
    parts: Callable[[str], list[str]] = whole  # the values inside it a log line could show
    attribute: str | None = None  # a ``Settings`` attribute listing more of them (a keyring)


SHARED = Secret(check_shared_secret)
RANDOM = Secret(decode_random_secret)
BLIND_INDEX = Secret(split_blind_index_keys, list_parts, attribute="blind_index_keys")
PREVIOUS_KEYS = Secret(check_previous_keys, list_parts, attribute="previous_secret_keys")
KEYRING = Secret(parse_keyring, keyring_parts)
AES_KEY = Secret(check_encoding_aes_key)
SIGNING_KEY = Secret(check_signing_key, pem_parts)
URL = Secret(None, url_secrets)


def marker_of(field: FieldInfo) -> Secret | None:
    return next((m for m in field.metadata if isinstance(m, Secret)), None)


def secret_fields(settings_class) -> dict[str, Secret]:
    """{field name: its marker} of every secret setting of ``settings_class``."""
    return {name: marker for name, field in settings_class.model_fields.items()
            if (marker := marker_of(field)) is not None}


def raw_value(value) -> str:
    if value is None:
        return ""
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


def check_strength(settings_class, name: str, value):
    """The one validator every setting passes through (``SettingsGroup``): a marked secret's
    strength rule; blank is "not set" for an optional one, an error for a required one."""
    field = settings_class.model_fields[name]
    marker = marker_of(field)
    if marker is None or marker.check is None or value is None:
        return value
    raw = raw_value(value)
    if not raw.strip():
        if field.is_required():
            raise ValueError("must not be empty")
        return value
    marker.check(raw)
    return value


def secret_values(settings) -> list[str]:
    """Every secret value ``settings`` holds, as a log line could show it: the logs' redaction
    list, derived from the markers alone."""
    found: list[str] = []
    for name, marker in secret_fields(type(settings)).items():
        raw = raw_value(getattr(settings, name))
        if raw:
            found += marker.parts(raw)
        if marker.attribute:
            found += getattr(settings, marker.attribute)
    return [value for value in dict.fromkeys(found) if value]
