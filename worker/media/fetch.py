"""A media message's bytes: from WeCom's ``media/get`` (the app's messages), or from the URL an AI
bot message names, decrypted with the message's own ``aeskey`` (the long connection's) or the
bot's EncodingAESKey. Both stop at ``MEDIA_MAX_BYTES``.

An AI bot URL is fetched only from a host on ``MEDIA_URL_HOSTS`` (WeCom puts the bot's images
and files on its object storage, ``ww-aibot-img-….cos.ap-guangzhou.myqcloud.com``), over http(s),
without credentials in it, and a redirect is refused rather than followed: a URL that the
worker fetches from inside the network must not be turned towards 127.0.0.1 or a metadata
service (a blind SSRF).
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests

from app.wecom.client import read_limited
from app.wecom.crypto import decrypt_media
from app.wecom.exceptions import (
    InvalidMediaError,
    MediaRejectedError,
    WeComAPIError,
    WeComCryptoError,
    WeComTransientError,
)
from worker.media.errors import (
    EXPIRED,
    IMAGE_UNREADABLE,
    TOO_LARGE,
    VOICE_UNREADABLE,
    MediaFailure,
    MediaUnavailable,
    megabytes,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fetched:
    data: bytes
    content_type: str = ""
    filename: str = ""


def media_key(text: str) -> bytes | None:
    """A message's own ``aeskey`` (base64, standard or URL-safe, padding optional) as 32 bytes."""
    padded = text.strip() + "=" * (-len(text.strip()) % 4)
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            key = decode(padded)
        except ValueError:
            continue
        if len(key) == 32:
            return key
    return None


def allowed_hosts(spec: str) -> tuple[str, ...]:
    """``MEDIA_URL_HOSTS``: host names, comma-separated; ``*.example.com`` takes its subdomains."""
    return tuple(h.strip().lower().rstrip(".") for h in spec.split(",") if h.strip())


def host_allowed(host: str, hosts: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    return any(host == h or (h.startswith("*.") and host.endswith(h[1:])) for h in hosts)


def url_refusal(url: str, hosts: tuple[str, ...]) -> str | None:
    """Why the worker will not fetch ``url`` (for the row's reason), or None."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        return "media url: not a URL"
    if parts.scheme not in ("https", "http") or not host:
        return "media url: not an http(s) URL"
    if parts.username is not None or parts.password is not None:
        return "media url: credentials in it"
    if not host_allowed(host, hosts):
        return "media url: host not on MEDIA_URL_HOSTS"
    return None


class MediaFetcher:
    def __init__(self, services, wecom, session: requests.Session | None = None):
        self.services, self.wecom = services, wecom
        self.settings = services.settings
        self.hosts = allowed_hosts(self.settings.media_url_hosts)
        self.http = session or requests.Session()

    def from_wecom(self, media_id: str, accept: tuple[str, ...] = ()) -> Fetched:
        """An app message's media through ``media/get``; ``accept``: the content types taken."""
        limit = self.settings.media_max_bytes
        try:
            media = self.wecom.get_media(media_id, max_bytes=limit, accept=accept)
        except InvalidMediaError as exc:
            raise MediaFailure(f"media: expired or unknown media_id ({exc.errcode})", EXPIRED) from None
        except MediaRejectedError as exc:
            if exc.too_large:
                raise MediaFailure(f"media: too large (over {limit} bytes)",
                                   TOO_LARGE.format(limit=megabytes(limit))) from None
            raise MediaFailure(f"media: {exc.errmsg}"[:120], VOICE_UNREADABLE if "audio/" in accept
                               else IMAGE_UNREADABLE) from None
        except WeComTransientError as exc:
            raise MediaUnavailable(f"wecom media/get: {exc}"[:120]) from None
        except WeComAPIError as exc:
            raise MediaFailure(f"media: wecom errcode {exc.errcode}", EXPIRED) from None
        return Fetched(media.data, media.content_type, media.filename)

    def from_url(self, url: str, own_key: str = "") -> Fetched:
        """An AI bot image or file: fetched from its URL (an allowed host, no redirect) and
        decrypted with its own ``aeskey`` (the long connection's), else the bot's EncodingAESKey."""
        key = media_key(own_key) if own_key else None
        if key is None and self.services.aibot_crypto is not None:
            key = self.services.aibot_crypto.key
        if key is None or not url.startswith(("https://", "http://")):
            raise MediaFailure("media: no AES key for it, or not an http(s) URL", EXPIRED)
        refusal = url_refusal(url, self.hosts)
        if refusal is not None:
            log.warning("media url refused: %s", refusal)  # never the URL: it carries a signature
            raise MediaFailure(refusal, EXPIRED)
        limit = self.settings.media_max_bytes
        try:
            resp = self.http.get(url, timeout=(3.05, 30), stream=True, allow_redirects=False)
        except requests.RequestException as exc:
            raise MediaUnavailable(f"media url: {type(exc).__name__}") from None
        if resp.is_redirect or 300 <= resp.status_code < 400:
            resp.close()
            log.warning("media url answered a redirect (HTTP %s): not followed", resp.status_code)
            raise MediaFailure(f"media url: redirect refused (HTTP {resp.status_code})", EXPIRED)
        if resp.status_code >= 500 or resp.status_code == 429:
            resp.close()
            raise MediaUnavailable(f"media url: HTTP {resp.status_code}")
        if resp.status_code != 200:
            resp.close()
            raise MediaFailure(f"media url: HTTP {resp.status_code} (expired?)", EXPIRED)
        try:
            data = read_limited(resp, limit + 32, "media")  # + the padding
        except MediaRejectedError:
            raise MediaFailure(f"media: too large (over {limit} bytes)",
                               TOO_LARGE.format(limit=megabytes(limit))) from None
        except requests.RequestException as exc:
            raise MediaUnavailable(f"media url: {type(exc).__name__}") from None
        try:
            return Fetched(decrypt_media(key, data))
        except WeComCryptoError:
            raise MediaFailure("media: not encrypted with the AI bot's key", EXPIRED) from None
