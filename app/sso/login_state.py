"""A started WeCom sign-in: single use, expiring, bound to the browser that started it.

``begin`` makes two random values: ``state``, which travels through WeCom in the URL (so it may
be seen in WeCom's logs, a proxy's or a referrer), and ``verifier``, which never leaves our
signed session cookie. Redis keeps, under the state's SHA-256, only the verifier's SHA-256 (the
PKCE idea: WeCom has no PKCE, so we check it ourselves) with ``WECOM_LOGIN_STATE_TTL_S``.

``finish`` accepts the state WeCom sent back only when it is the one this browser's cookie holds,
the Redis record is still there (``GETDEL``: a second use, from any browser or worker, finds
nothing), and the cookie's verifier hashes to the recorded one. A code seen once is remembered
(``claim_code``) for ``CODE_MEMORY_S``, so a replayed code is refused before WeCom is asked.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass

STATE_PREFIX = "wecom-login:state:"
CODE_PREFIX = "wecom-login:code:"
CODE_MEMORY_S = 600  # WeCom's codes live 5 minutes; remembered twice as long
MAX_VALUE_LENGTH = 512  # what a state or code from the query string may be; WeCom's are short


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Pending:
    """What the browser's session keeps between the redirect to WeCom and the way back."""

    state: str
    verifier: str

    def to_session(self) -> dict:
        return {"state": self.state, "verifier": self.verifier}

    @classmethod
    def from_session(cls, value) -> Pending | None:
        if not isinstance(value, dict):
            return None
        state, verifier = value.get("state"), value.get("verifier")
        if not isinstance(state, str) or not isinstance(verifier, str):
            return None
        return cls(state, verifier)


class StateRefused(Exception):
    """Why a sign-in coming back from WeCom is not taken (``outcome`` goes to the audit log)."""

    def __init__(self, outcome: str):
        super().__init__(outcome)
        self.outcome = outcome


class LoginStates:
    def __init__(self, redis, ttl_s: int):
        self.redis = redis
        self.ttl_s = int(ttl_s)

    def begin(self, channel: str, next_path: str | None = None) -> Pending:
        pending = Pending(secrets.token_urlsafe(24), secrets.token_urlsafe(32))
        record = {"challenge": _digest(pending.verifier), "channel": channel, "next": next_path}
        self.redis.set(STATE_PREFIX + _digest(pending.state), json.dumps(record), ex=self.ttl_s, nx=True)
        return pending

    def finish(self, pending: Pending | None, returned_state: str) -> dict:
        """The recorded sign-in (``channel``, ``next``), used up; ``StateRefused`` otherwise."""
        if not returned_state or len(returned_state) > MAX_VALUE_LENGTH:
            raise StateRefused("bad_state")
        if pending is None:
            raise StateRefused("no_session")  # another browser, or the cookie was lost
        if not secrets.compare_digest(pending.state.encode(), returned_state.encode()):
            raise StateRefused("bad_state")
        raw = self.redis.getdel(STATE_PREFIX + _digest(returned_state))
        if raw is None:
            raise StateRefused("state_spent")
        record = json.loads(raw)
        if not secrets.compare_digest(record.get("challenge", "").encode(),
                                      _digest(pending.verifier).encode()):
            raise StateRefused("bad_verifier")
        return record

    def claim_code(self, code: str) -> None:
        """Remember ``code`` as used; ``StateRefused`` when it was used before."""
        if not code or len(code) > MAX_VALUE_LENGTH:
            raise StateRefused("bad_code")
        if not self.redis.set(CODE_PREFIX + _digest(code), "1", ex=CODE_MEMORY_S, nx=True):
            raise StateRefused("code_replayed")
