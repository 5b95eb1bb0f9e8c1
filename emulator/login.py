"""WeCom's web sign-in as the admin site sees it: the QR login page
(``/wwlogin/sso/login``, 企业微信扫码登录), OAuth inside the WeCom client
(``/connect/oauth2/authorize``) and ``/cgi-bin/auth/getuserinfo``.

Where the real page shows a QR code for the phone to scan, this one lists the directory's members
(and one WeChat user from outside the company): choosing one and confirming is the scan. The
browser is then sent to ``redirect_uri`` with ``code`` and the caller's ``state``, as WeCom does.
A code names its member, works once and lives five minutes (errcode 40029 otherwise).
"""

from __future__ import annotations

import secrets
import threading
import time
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from flask import Blueprint, current_app, redirect, render_template, request

from emulator.api import answer, error, state

bp = Blueprint("wecom_login", __name__)
CODE_TTL_S = 300.0
OUTSIDER = "wechat-outsider"  # the choice that plays a WeChat user who is no member


class LoginCodes:
    """The codes the confirm step issued: code -> (userid or None for the outsider, expiry)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._codes: dict[str, tuple[str | None, float]] = {}
        self._lock = threading.Lock()
        self.issued = 0

    def issue(self, userid: str | None) -> str:
        code = secrets.token_urlsafe(24)
        with self._lock:
            now = self.clock()
            self._codes = {c: v for c, v in self._codes.items() if v[1] > now}
            self._codes[code] = (userid, now + CODE_TTL_S)
            self.issued += 1
        return code

    def take(self, code: str) -> tuple[bool, str | None]:
        """(valid, userid): a code is taken once, before it expires."""
        with self._lock:
            found = self._codes.pop(code, None)
        if found is None or found[1] <= self.clock():
            return False, None
        return True, found[0]


def codes() -> LoginCodes:
    return current_app.extensions["wecom_emulator_login"]


def _refused(message: str, status: int = 400):
    return render_template("login.html", problem=message), status


def _check_request(channel: str) -> str | None:
    """What WeCom would refuse about this authorize request, or None."""
    cfg = state().config
    args = request.args
    if args.get("appid") != cfg.corp_id:
        return "appid 参数错误 (the appid is not this corp's id)"
    if channel == "qr":
        if args.get("login_type") != "CorpApp":
            return "login_type 参数错误 (this emulator plays CorpApp logins)"
        if str(args.get("agentid")) != str(cfg.agent_id):
            return "agentid 参数错误 (no such app)"
    else:
        if args.get("response_type") != "code" or args.get("scope") not in ("snsapi_base", "snsapi_privateinfo"):
            return "response_type or scope 参数错误"
    target = urlsplit(args.get("redirect_uri", ""))
    if target.scheme not in ("http", "https") or not target.hostname:
        return "redirect_uri 参数错误"
    return None


def _page(channel: str):
    problem = _check_request(channel)
    if problem:
        return _refused(problem)
    state().bump("login", f"{channel}_pages")
    return render_template("login.html", problem=None, channel=channel,
                           users=state().directory.users, outsider=OUTSIDER,
                           redirect_uri=request.args["redirect_uri"], state=request.args.get("state", ""))


@bp.get("/wwlogin/sso/login")
def qr_login():
    return _page("qr")


@bp.get("/connect/oauth2/authorize")
def oauth_authorize():
    return _page("oauth")


@bp.post("/_emulator/login/confirm")
def confirm():
    """The member confirmed on the phone: back to ``redirect_uri`` with a fresh code."""
    userid = request.form.get("userid", "")
    member = state().directory.user(userid)
    if member is None and userid != OUTSIDER:
        return _refused("no such member")
    target = urlsplit(request.form.get("redirect_uri", ""))
    if target.scheme not in ("http", "https") or not target.hostname:
        return _refused("redirect_uri 参数错误")
    code = codes().issue(member["userid"] if member else None)
    query = parse_qsl(target.query, keep_blank_values=True) + [
        ("code", code), ("state", request.form.get("state", "")), ("appid", state().config.corp_id)]
    state().bump("login", "confirmed")
    return redirect(urlunsplit(target._replace(query=urlencode(query))))


@bp.get("/cgi-bin/auth/getuserinfo")
def getuserinfo():
    return answer("auth/getuserinfo", _getuserinfo)


def _getuserinfo() -> dict:
    code = state().check_token(request.args.get("access_token"))
    if code:
        return error(code)
    login_code = request.args.get("code", "")
    if not login_code:
        return error(41008, "missing code")
    valid, userid = codes().take(login_code)
    if not valid:
        return error(40029, "invalid code")
    if userid is None:  # not a member: WeCom answers an openid instead of a userid
        return error(0, openid="o" + secrets.token_hex(14))
    return error(0, userid=userid)
