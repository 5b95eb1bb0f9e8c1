"""WeCom server API for one self-built app: access_token, message/send, user/get, department/get,
media/get.

The access_token (gettoken, valid ``expires_in`` = 7200 s) is cached once for all processes in
Redis, refreshed ``token_refresh_margin`` seconds early. When it is missing, one process fetches
it under a Redis lock (SET NX PX, released only by its owner) while the others poll the cache
briefly; if Redis is unreachable each process keeps its own copy in memory.

Error policy (codes in ``exceptions.py``):

* 40001, 40014, 42001, 42007, 42009: the token is bad; refresh it and retry the call once;
* -1, 45009, HTTP 5xx/429, connection errors, timeouts: ``WeComTransientError``, never retried
  here: a send whose answer was lost may have been delivered, the caller retries with backoff
  (45009 and 429 are marked ``rate_limited``: the caller waits for WeCom's limit window);
* 60020 ``UntrustedIPError``, 81013 ``NoValidReceiverError``, ``invaliduser``/``unlicenseduser``
  naming the receiver ``InvalidUserError``/``UnlicensedUserError``; 40007 (a media_id unknown
  or past its 3 days) ``InvalidMediaError``; any other code ``WeComAPIError``;
* media/get answers the bytes themselves, or WeCom's JSON error with HTTP 200: the body is read
  only up to the caller's byte limit (``MediaRejectedError`` beyond it, or for a content type
  the caller does not accept).

Neither the secret nor a token is ever logged or put in an exception message.
"""

from __future__ import annotations

import json as json_module
import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import requests
from redis.exceptions import RedisError

from app.http.pool import HttpError, HttpPool, HttpTimeout
from app.http.session import session_for
from app.wecom.exceptions import (
    TOKEN_ERRCODES,
    InvalidUserError,
    MediaRejectedError,
    UnlicensedUserError,
    WeComAPIError,
    WeComTransientError,
    api_error,
)
from app.wecom.splitting import MARKDOWN_LIMIT, TEXT_LIMIT, split_for_wecom

logger = logging.getLogger(__name__)

DEFAULT_API_BASE = "https://qyapi.weixin.qq.com"
BYTE_LIMITS = {"text": TEXT_LIMIT, "markdown": MARKDOWN_LIMIT}
#: WeCom accepts a duplicate-check window of up to 4 hours.
MAX_DUPLICATE_CHECK_INTERVAL = 4 * 3600

_SECRET_IN_URL = re.compile(r"(access_token|corpsecret)=[^&\s'\"]+")
_RELEASE_LOCK = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


def redact(text: str) -> str:
    """``text`` with any access_token/corpsecret query value masked (requests puts URLs in errors)."""
    return _SECRET_IN_URL.sub(r"\1=***", text)


@dataclass(frozen=True)
class Media:
    """A file from media/get: its bytes, type (lower case, no parameters) and name, if told."""

    data: bytes
    content_type: str
    filename: str = ""


_FILENAME = re.compile(r"""filename\*?=(?:UTF-8'')?"?([^";]+)"?""", re.IGNORECASE)


def _filename(disposition: str | None) -> str:
    """The file name of a ``Content-Disposition`` header (WeCom: ``attachment; filename="a.pdf"``)."""
    match = _FILENAME.search(disposition or "")
    return unquote(match.group(1)).strip()[:200] if match else ""


def read_limited(response: requests.Response, max_bytes: int, what: str) -> bytes:
    """The body of a streamed ``response``, refused once it passes ``max_bytes``."""
    declared = response.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        response.close()
        raise MediaRejectedError(f"{what} is {int(declared)} bytes, over the {max_bytes} limit",
                                 too_large=True)
    parts, size = [], 0
    for part in response.iter_content(64 * 1024):
        size += len(part)
        if size > max_bytes:
            response.close()
            raise MediaRejectedError(f"{what} is over the {max_bytes} byte limit", too_large=True)
        parts.append(part)
    return b"".join(parts)


def _retry_after(value: str | None) -> float | None:
    """An HTTP ``Retry-After`` in seconds (the delta-seconds form; a date is ignored)."""
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None


class WeComClient:
    """One app (corp_id + secret + agent_id) of one corp."""

    lock_timeout = 15.0  # seconds a fetcher may hold the refresh lock (> connect + read timeout)
    lock_wait = 5.0  # seconds another process waits for the fetcher before fetching itself
    poll_interval = 0.05
    redis_retry_after = 30.0  # seconds to skip Redis after it failed, so an outage costs one wait

    def __init__(self, corp_id: str, secret: str, agent_id: int | str,
                 api_base: str = DEFAULT_API_BASE, redis: Any = None,
                 session: requests.Session | None = None,
                 timeout: float | tuple[float, float] = (3.05, 10),
                 token_refresh_margin: int = 300):
        self.corp_id = corp_id
        self._secret = secret
        self.agent_id = int(agent_id)
        self.api_base = api_base.rstrip("/")
        self.redis = redis
        self.session = session or session_for(self.api_base)  # media downloads
        self.http = HttpPool(self.api_base)  # the JSON API (app/http/pool.py)
        self.timeout = timeout
        self.token_refresh_margin = token_refresh_margin
        # One token per app: the key names the app (never the secret, which may rotate).
        self.token_key = f"wecom:access_token:{corp_id}:{self.agent_id}"
        self.lock_key = f"{self.token_key}:lock"
        self._local_token: str | None = None
        self._local_expires_at = 0.0
        self._local_lock = threading.Lock()
        self._redis_down_until = 0.0
        self._release_script = redis.register_script(_RELEASE_LOCK) if redis is not None else None

    def __repr__(self) -> str:  # no secret, no token
        return f"WeComClient(corp_id={self.corp_id!r}, agent_id={self.agent_id})"

    # --- access token ------------------------------------------------------------------------

    def access_token(self, force_refresh: bool = False) -> str:
        """A valid access_token, from the shared cache unless missing or ``force_refresh``."""
        cached = self._cached_token()
        if cached and not force_refresh:
            return cached
        return self._refresh(rejected=cached if force_refresh else None)

    def _refresh(self, rejected: str | None) -> str:
        """Fetch a new token unless another process already replaced ``rejected`` (or None)."""
        if not self._redis_usable():
            return self._refresh_locally(rejected)
        try:
            return self._refresh_shared(rejected)
        except RedisError as exc:
            self._redis_failed(exc)
            return self._refresh_locally(rejected)

    def _refresh_shared(self, rejected: str | None) -> str:
        owner = secrets.token_hex(16)
        deadline = time.monotonic() + self.lock_wait
        while True:
            if self.redis.set(self.lock_key, owner, nx=True, px=int(self.lock_timeout * 1000)):
                try:
                    fresh = self._shared_token()  # someone may have refreshed it meanwhile
                    if fresh and fresh != rejected:
                        return fresh
                    return self._fetch_and_store()
                finally:
                    self._release_script(keys=[self.lock_key], args=[owner])
            time.sleep(self.poll_interval)
            fresh = self._shared_token()
            if fresh and fresh != rejected:
                return fresh
            if time.monotonic() > deadline:
                # The holder is stuck or gone; gettoken is idempotent while a token is valid.
                logger.warning("waited %.1fs for the WeCom token lock; fetching directly",
                               self.lock_wait)
                return self._fetch_and_store()

    def _refresh_locally(self, rejected: str | None) -> str:
        with self._local_lock:
            token = self._local_cached_token()
            if token and token != rejected:
                return token
            return self._fetch_and_store(shared=False)

    def _cached_token(self) -> str | None:
        if self._redis_usable():
            try:
                return self._shared_token()
            except RedisError as exc:
                self._redis_failed(exc)
        return self._local_cached_token()

    def _redis_usable(self) -> bool:
        return self.redis is not None and time.monotonic() >= self._redis_down_until

    def _redis_failed(self, exc: RedisError) -> None:
        self._redis_down_until = time.monotonic() + self.redis_retry_after
        logger.warning("Redis unreachable for the WeCom token cache (%s); using a process-local "
                       "token for %.0fs", type(exc).__name__, self.redis_retry_after)

    def _shared_token(self) -> str | None:
        value = self.redis.get(self.token_key)
        if isinstance(value, bytes):
            value = value.decode()
        return value or None

    def _local_cached_token(self) -> str | None:
        if self._local_token and time.monotonic() < self._local_expires_at:
            return self._local_token
        return None

    def _fetch_and_store(self, shared: bool = True) -> str:
        data = self._request("GET", "/cgi-bin/gettoken",
                             params={"corpid": self.corp_id, "corpsecret": self._secret})
        if data.get("errcode", 0) != 0:
            raise api_error(int(data["errcode"]), str(data.get("errmsg", "")), data)
        token = data.get("access_token")
        if not isinstance(token, str) or not token:
            raise WeComAPIError(-1, "gettoken answered without an access_token", {})
        ttl = self._cache_ttl(int(data.get("expires_in", 7200)))
        self._local_token, self._local_expires_at = token, time.monotonic() + ttl
        if shared and self._redis_usable():
            self.redis.set(self.token_key, token, px=int(ttl * 1000))
        logger.info("fetched a new WeCom access_token for agent %s (cached %ss)", self.agent_id, ttl)
        return token

    def _cache_ttl(self, expires_in: int) -> int:
        # Refresh early by the margin; a token shorter-lived than twice the margin (only ever
        # seen from test doubles) is kept for half its life instead.
        if expires_in > 2 * self.token_refresh_margin:
            return expires_in - self.token_refresh_margin
        return max(1, expires_in // 2)

    # --- calls -------------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, params: dict | None = None,
              json: dict | None = None) -> dict:
        """One API call with the token; on a token errcode refresh once and retry once."""
        token = self.access_token()
        data = self._request(method, path, params={**(params or {}), "access_token": token},
                             json=json)
        errcode = int(data.get("errcode", 0))
        if errcode in TOKEN_ERRCODES:
            logger.info("WeCom rejected the access_token (errcode %s); refreshing once", errcode)
            token = self._refresh(rejected=token)
            data = self._request(method, path, params={**(params or {}), "access_token": token},
                                 json=json)
            errcode = int(data.get("errcode", 0))
        if errcode != 0:
            raise api_error(errcode, str(data.get("errmsg", "")), data)
        return data

    def post(self, path: str, body: dict) -> dict:
        """POST ``body`` to an API area's ``path`` with the token (``app.wecom.kf``): WeCom's
        answer, or the ``WeComAPIError``/``WeComTransientError`` its errcode names."""
        return self._call("POST", path, json=body)

    def _request(self, method: str, path: str, *, params: dict, json: dict | None = None) -> dict:
        try:
            response = self.http.request(method, self.api_base + path, params=params, json_body=json,
                                         timeout=self.timeout)
        except HttpTimeout as exc:  # its message never holds the URL (the token is in it)
            raise WeComTransientError(None, f"timeout calling {path}: {exc}") from None
        except HttpError as exc:
            raise WeComTransientError(None, f"{exc} calling {path}") from None
        status = response.status
        if status == 429:
            raise WeComTransientError(None, f"HTTP 429 from {path}", rate_limited=True,
                                      retry_after=_retry_after(response.headers.get("Retry-After")))
        if status >= 500:
            raise WeComTransientError(None, f"HTTP {status} from {path}")
        if status != 200:
            raise WeComAPIError(-status, f"HTTP {status} from {path}", {})
        try:
            data = response.json()
        except ValueError:
            raise WeComTransientError(None, f"non-JSON answer from {path}") from None
        if not isinstance(data, dict):
            raise WeComTransientError(None, f"unexpected JSON from {path}")
        return data

    # --- message/send --------------------------------------------------------------------------

    def send(self, touser: str, msgtype: str, content: str, *,
             duplicate_check_interval: int | None = None) -> dict:
        """Send one chunk (it must fit WeCom's byte limit) to ``touser``; WeCom's answer.

        ``duplicate_check_interval`` (seconds, at most 4 h) switches on WeCom's own duplicate
        check: the same request body within the interval is not delivered twice, which makes a
        retried task safe.
        """
        if msgtype not in BYTE_LIMITS:
            raise ValueError(f"msgtype must be one of {sorted(BYTE_LIMITS)}")
        if not touser or touser == "@all" or "@all" in touser.split("|"):
            raise ValueError("touser must name members; the bot never broadcasts to @all")
        if not content.strip():
            raise ValueError("content is empty")
        size = len(content.encode("utf-8"))
        if size > BYTE_LIMITS[msgtype]:
            raise ValueError(f"{msgtype} content is {size} bytes, over WeCom's "
                             f"{BYTE_LIMITS[msgtype]}; split it first")
        body: dict[str, Any] = {
            "touser": touser,
            "msgtype": msgtype,
            "agentid": self.agent_id,
            msgtype: {"content": content},
            "safe": 0,
        }
        if duplicate_check_interval is not None:
            if not 0 < duplicate_check_interval <= MAX_DUPLICATE_CHECK_INTERVAL:
                raise ValueError("duplicate_check_interval must be 1..14400 seconds")
            body["enable_duplicate_check"] = 1
            body["duplicate_check_interval"] = int(duplicate_check_interval)
        data = self._call("POST", "/cgi-bin/message/send", json=body)
        self._check_receivers(touser, data)
        return data

    def send_template_card(self, touser: str, card: dict, *,
                           duplicate_check_interval: int | None = None) -> dict:
        """Send a template card (模板卡片消息) to ``touser``; WeCom's answer carries the
        ``response_code`` that may update the card once (``update_template_card``)."""
        if not touser or "@all" in touser.split("|"):
            raise ValueError("touser must name members; the bot never broadcasts to @all")
        body: dict[str, Any] = {"touser": touser, "msgtype": "template_card",
                                "agentid": self.agent_id, "template_card": card}
        if duplicate_check_interval is not None:
            body["enable_duplicate_check"] = 1
            body["duplicate_check_interval"] = int(min(duplicate_check_interval,
                                                       MAX_DUPLICATE_CHECK_INTERVAL))
        data = self._call("POST", "/cgi-bin/message/send", json=body)
        self._check_receivers(touser, data)
        return data

    def update_template_card(self, userids: list[str], response_code: str, *,
                             replace_name: str) -> dict:
        """Turn a clicked card's buttons into one that cannot be clicked, labelled
        ``replace_name`` (更新模版卡片消息; ``response_code`` is usable once, within 72 h)."""
        body = {"userids": list(userids), "agentid": self.agent_id,
                "response_code": response_code, "button": {"replace_name": replace_name}}
        return self._call("POST", "/cgi-bin/message/update_template_card", json=body)

    @staticmethod
    def _check_receivers(touser: str, data: dict) -> None:
        # WeCom answers errcode 0 with the receivers it dropped, lower-cased.
        targets = [user for user in touser.split("|") if user]
        for field, error in (("invaliduser", InvalidUserError),
                             ("unlicenseduser", UnlicensedUserError)):
            listed = {u.lower() for u in str(data.get(field) or "").split("|") if u}
            dropped = [user for user in targets if user.lower() in listed]
            if dropped:
                raise error(int(data.get("errcode", 0)), f"{field}: receiver not reachable",
                            data, users=dropped)

    def send_text(self, touser: str, content: str, *, duplicate_check_interval: int | None = None,
                  first_chunk: int = 0) -> list[dict]:
        """Split ``content`` at 2048 bytes and send the chunks in order; WeCom's answers."""
        return self._send_chunks(touser, "text", content, duplicate_check_interval, first_chunk)

    def send_markdown(self, touser: str, content: str, *,
                      duplicate_check_interval: int | None = None,
                      first_chunk: int = 0) -> list[dict]:
        """Split ``content`` at 4096 bytes and send the chunks in order; WeCom's answers."""
        return self._send_chunks(touser, "markdown", content, duplicate_check_interval,
                                 first_chunk)

    def _send_chunks(self, touser: str, msgtype: str, content: str,
                     duplicate_check_interval: int | None, first_chunk: int) -> list[dict]:
        chunks = split_for_wecom(content, BYTE_LIMITS[msgtype], markup=msgtype == "markdown")
        if not chunks:
            raise ValueError("content is empty")
        answers = []
        for index in range(first_chunk, len(chunks)):
            try:
                answers.append(self.send(touser, msgtype, chunks[index],
                                         duplicate_check_interval=duplicate_check_interval))
            except WeComAPIError as exc:
                # A retrying task passes this back as first_chunk to resume, not repeat.
                exc.chunks_sent = index
                raise
        return answers

    # --- user/get ------------------------------------------------------------------------------

    def get_user(self, userid: str) -> dict:
        """The member's record (name, department list, main_department, ...) from user/get."""
        if not userid:
            raise ValueError("userid is empty")
        return self._call("GET", "/cgi-bin/user/get", params={"userid": userid})

    # --- auth/getuserinfo (web sign-in) --------------------------------------------------------

    def get_user_info(self, code: str) -> dict:
        """Who a sign-in ``code`` (from the QR login or OAuth redirect) belongs to: ``userid`` for
        a member of the corp, ``openid`` for anyone else. WeCom takes each code once, within
        five minutes (errcode 40029 otherwise)."""
        if not code:
            raise ValueError("code is empty")
        return self._call("GET", "/cgi-bin/auth/getuserinfo", params={"code": code})

    # --- department/get ------------------------------------------------------------------------

    def get_department(self, dept_id: int) -> dict:
        """One department (``id``, ``parentid``, ``department_leader``: its heads' userids, those
        within the app's visible range) from department/get."""
        department = self._call("GET", "/cgi-bin/department/get", params={"id": int(dept_id)}).get("department")
        if not isinstance(department, dict):
            raise WeComAPIError(-1, "department/get answered without a department", {})
        return department

    # --- appchat/get ---------------------------------------------------------------------------

    def get_app_chat(self, chatid: str) -> dict:
        """A group chat's ``chat_info`` (``chatid``, ``name``, ``owner``, ``userlist``) from
        appchat/get. WeCom answers it only for a group chat this app created (appchat/create);
        any other chat is an errcode (86003 unknown, 86008 not this app's)."""
        if not chatid:
            raise ValueError("chatid is empty")
        info = self._call("GET", "/cgi-bin/appchat/get", params={"chatid": chatid}).get("chat_info")
        if not isinstance(info, dict) or not isinstance(info.get("userlist"), list):
            raise WeComAPIError(-1, "appchat/get answered without chat_info.userlist", {})
        return info

    # --- media/get -----------------------------------------------------------------------------

    def get_media(self, media_id: str, *, max_bytes: int,
                  accept: tuple[str, ...] = ()) -> Media:
        """A temporary media (a callback's image, voice or file) by ``media_id``.

        ``accept``: content type prefixes taken (``("image/",)``); empty takes any. A body over
        ``max_bytes`` is refused while it is read, never held whole.
        """
        if not media_id:
            raise ValueError("media_id is empty")
        token = self.access_token()
        for attempt in (0, 1):
            response = self._get_stream("/cgi-bin/media/get",
                                        {"access_token": token, "media_id": media_id})
            content_type = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if content_type in ("application/json", "text/plain"):
                # WeCom's errors come as JSON with HTTP 200 (text/plain from some front ends);
                # a TXT file is text/plain too, so it is read within the caller's limit.
                body = read_limited(response, max(max_bytes, 64 * 1024), "media")
                data = None
                if body[:1] == b"{" and len(body) < 64 * 1024:
                    try:
                        data = json_module.loads(body)
                    except ValueError:
                        data = None
                if isinstance(data, dict) and int(data.get("errcode", 0) or 0) != 0:
                    errcode = int(data["errcode"])
                    if errcode in TOKEN_ERRCODES and attempt == 0:
                        logger.info("WeCom rejected the access_token (errcode %s); refreshing once", errcode)
                        token = self._refresh(rejected=token)
                        continue
                    raise api_error(errcode, str(data.get("errmsg", "")), data)
                if accept and not any(content_type.startswith(a) for a in accept):
                    raise MediaRejectedError(f"media is {content_type}, not {'/'.join(accept)}")
                if len(body) > max_bytes:
                    raise MediaRejectedError(f"media is over the {max_bytes} byte limit", too_large=True)
                return Media(body, content_type, _filename(response.headers.get("Content-Disposition")))
            if accept and not any(content_type.startswith(a) for a in accept):
                response.close()
                raise MediaRejectedError(f"media is {content_type or 'untyped'}, not {'/'.join(accept)}")
            data = read_limited(response, max_bytes, "media")
            return Media(data, content_type, _filename(response.headers.get("Content-Disposition")))
        raise WeComAPIError(-1, "media/get: the token was refused twice", {})  # pragma: no cover

    def _get_stream(self, path: str, params: dict) -> requests.Response:
        try:
            response = self.session.get(self.api_base + path, params=params, timeout=self.timeout,
                                        stream=True)
        except requests.Timeout as exc:
            raise WeComTransientError(None, f"timeout calling {path}: {redact(str(exc))}") from None
        except requests.RequestException as exc:
            raise WeComTransientError(
                None, f"{type(exc).__name__} calling {path}: {redact(str(exc))}") from None
        if response.status_code == 429:
            response.close()
            raise WeComTransientError(None, f"HTTP 429 from {path}", rate_limited=True,
                                      retry_after=_retry_after(response.headers.get("Retry-After")))
        if response.status_code >= 500:
            response.close()
            raise WeComTransientError(None, f"HTTP {response.status_code} from {path}")
        if response.status_code != 200:
            response.close()
            raise WeComAPIError(-response.status_code, f"HTTP {response.status_code} from {path}", {})
        return response
