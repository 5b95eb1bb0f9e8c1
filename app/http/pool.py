"""urllib3's connection pool for one service's JSON API: the worker's two calls a message.

Every message costs the worker two HTTP calls (the model, WeCom's message/send). Through
``requests`` each cost about 0.3 ms more CPU than the same call on urllib3, the pool requests
itself sits on (preparing the request, cookies, hooks, adapters; about a twentieth of the
worker's CPU under ``bench.load``), so those calls go to urllib3 directly. What ``session_for``
takes from the environment, once, applies the same way here: the proxy for the service's URL
(none when ``NO_PROXY`` covers its host), the CA bundle (``REQUESTS_CA_BUNDLE`` /
``CURL_CA_BUNDLE``, else certifi's, as requests), and ``~/.netrc`` credentials for its host.
No redirects are followed (an API that answers 3xx is an error, and a credential must not go
to another host) and no retries are made here: the callers retry as they see fit.

The rarer calls (media downloads, uploads, webhooks) stay on ``requests`` (app/http/session.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from urllib.parse import urlencode, urlsplit

import certifi
import urllib3
from requests.utils import get_environ_proxies, get_netrc_auth

from app.http.session import POOL_CONNECTIONS

JSON_HEADERS = {"Content-Type": "application/json"}
STREAM_READ = 512  # bytes per read of a streamed body that is not chunked (requests' iter_lines)


class HttpError(Exception):
    """The call did not get an HTTP answer; ``str()`` names the cause, never the URL."""


class HttpTimeout(HttpError):
    pass


class HttpUnreachable(HttpError):
    pass


class HttpPool:
    """Keep-alive connections to the service at ``base_url`` (up to ``maxsize`` idle ones)."""

    def __init__(self, base_url: str, maxsize: int = POOL_CONNECTIONS):
        scheme = urlsplit(base_url).scheme or "http"
        proxies = get_environ_proxies(base_url)  # {} when NO_PROXY covers the host
        proxy = proxies.get(scheme) or proxies.get("all")
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or certifi.where()
        options = {"maxsize": maxsize, "retries": False, "cert_reqs": "CERT_REQUIRED", "ca_certs": bundle}
        self._pool = urllib3.ProxyManager(proxy, **options) if proxy else urllib3.PoolManager(**options)
        auth = get_netrc_auth(base_url)
        self._headers = urllib3.make_headers(basic_auth=":".join(auth)) if auth else {}

    def request(self, method: str, url: str, *, params: dict | None = None, body: bytes | None = None,
                json_body: dict | None = None, headers: dict | None = None,
                timeout: float | tuple[float, float], stream: bool = False) -> urllib3.BaseHTTPResponse:
        """The answer to one call, read whole unless ``stream`` (then close it when done);
        ``json_body`` is sent as JSON."""
        if params:
            url = f"{url}{'&' if '?' in url else '?'}{urlencode(params)}"
        if json_body is not None:
            body, headers = json.dumps(json_body).encode(), {**JSON_HEADERS, **(headers or {})}
        connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        try:
            return self._pool.request(method, url, body=body, headers={**self._headers, **(headers or {})},
                                      timeout=urllib3.Timeout(connect=connect, read=read),
                                      redirect=False, preload_content=not stream)
        except urllib3.exceptions.HTTPError as exc:
            raise _error(exc) from None

    def post_json(self, url: str, payload: dict, *, headers: dict | None = None,
                  timeout: float | tuple[float, float], stream: bool = False) -> urllib3.BaseHTTPResponse:
        return self.request("POST", url, json_body=payload, headers=headers, timeout=timeout, stream=stream)


def iter_lines(response: urllib3.BaseHTTPResponse) -> Iterator[str]:
    """A streamed answer's lines as they arrive (an HTTP chunk at a time), decoded as UTF-8; a
    connection that breaks or stalls past the read timeout mid-body raises ``HttpError``."""
    pending = b""
    try:
        for data in response.stream(STREAM_READ, decode_content=True):
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
    except urllib3.exceptions.HTTPError as exc:
        raise _error(exc) from None
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


def _error(exc: urllib3.exceptions.HTTPError) -> HttpError:
    """requests' split: a refused or failed connection is unreachable (urllib3 makes
    ``NewConnectionError`` a kind of connect timeout), a connect or read that ran out of time
    is a timeout."""
    if isinstance(exc, urllib3.exceptions.TimeoutError) and not isinstance(
            exc, urllib3.exceptions.NewConnectionError):
        return HttpTimeout(type(exc).__name__)
    return HttpUnreachable(type(exc).__name__)
