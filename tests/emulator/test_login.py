"""The emulator's WeCom sign-in (emulator/login.py): its pages refuse what WeCom refuses, the
confirm step sends the browser back with a code and the caller's state, and
``auth/getuserinfo`` takes each code once, with a valid access_token, within five minutes."""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests

from emulator import EmulatorConfig, EmulatorServer
from emulator.login import CODE_TTL_S, OUTSIDER

CORP, AGENT = "wwlogintest0001", 1000002
BACK = "http://admin.example.com/admin/login/wecom/callback?keep=1"


@pytest.fixture
def emu():
    with EmulatorServer(EmulatorConfig(corp_id=CORP, agent_id=AGENT)) as server:
        yield server


def token(emu) -> str:
    answer = requests.get(f"{emu.url}/cgi-bin/gettoken", timeout=5,
                          params={"corpid": CORP, "corpsecret": emu.state.config.secret}).json()
    return answer["access_token"]


def confirm(emu, userid: str, state: str = "st-1") -> dict:
    back = requests.post(f"{emu.url}/_emulator/login/confirm", allow_redirects=False, timeout=5,
                         data={"userid": userid, "redirect_uri": BACK, "state": state})
    assert back.status_code == 302, back.text
    location = urlsplit(back.headers["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == BACK.split("?")[0]
    return {k: v[0] for k, v in parse_qs(location.query).items()}


def test_the_qr_page_lists_the_members_and_refuses_bad_requests(emu):
    good = {"login_type": "CorpApp", "appid": CORP, "agentid": AGENT, "redirect_uri": BACK, "state": "s"}
    page = requests.get(f"{emu.url}/wwlogin/sso/login?{urlencode(good)}", timeout=5)
    assert page.status_code == 200 and "zhangwei" in page.text and OUTSIDER in page.text
    for bad in ({"appid": "wwother"}, {"agentid": 999}, {"login_type": "ServiceApp"},
                {"redirect_uri": "javascript:alert(1)"}, {"redirect_uri": ""}):
        refused = requests.get(f"{emu.url}/wwlogin/sso/login?{urlencode({**good, **bad})}", timeout=5)
        assert refused.status_code == 400 and 'id="problem"' in refused.text, bad
    oauth = {"appid": CORP, "redirect_uri": BACK, "response_type": "code", "scope": "snsapi_base",
             "state": "s", "agentid": AGENT}
    assert requests.get(f"{emu.url}/connect/oauth2/authorize?{urlencode(oauth)}", timeout=5).status_code == 200
    oauth["scope"] = "snsapi_userinfo"
    assert requests.get(f"{emu.url}/connect/oauth2/authorize?{urlencode(oauth)}", timeout=5).status_code == 400


def test_confirm_sends_back_code_and_state_keeping_the_callbacks_query(emu):
    back = confirm(emu, "LiNa", state="abc")
    assert back["state"] == "abc" and back["appid"] == CORP and back["keep"] == "1" and back["code"]
    unknown = requests.post(f"{emu.url}/_emulator/login/confirm", timeout=5, allow_redirects=False,
                            data={"userid": "nobody", "redirect_uri": BACK, "state": "x"})
    assert unknown.status_code == 400


def test_getuserinfo_takes_a_code_once(emu):
    access_token = token(emu)
    code = confirm(emu, "LiNa")["code"]

    def ask(code, tok=access_token):
        return requests.get(f"{emu.url}/cgi-bin/auth/getuserinfo", timeout=5,
                            params={"access_token": tok, "code": code}).json()

    assert ask(code, "not-a-token")["errcode"] == 40014
    first = ask(code)
    assert first["errcode"] == 0 and first["userid"] == "lina"
    assert ask(code)["errcode"] == 40029
    assert ask("")["errcode"] == 41008
    outsider = ask(confirm(emu, OUTSIDER)["code"])
    assert outsider["errcode"] == 0 and "userid" not in outsider and outsider["openid"].startswith("o")


def test_a_code_expires_after_five_minutes(emu):
    codes = emu.app.extensions["wecom_emulator_login"]
    now = [1000.0]
    codes.clock = lambda: now[0]
    code = codes.issue("lina")
    now[0] += CODE_TTL_S + 1
    assert codes.take(code) == (False, None)
    fresh = codes.issue("lina")
    assert codes.take(fresh) == (True, "lina")
