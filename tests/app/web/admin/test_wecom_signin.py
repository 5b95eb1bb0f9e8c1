"""Signing in to the admin site with WeCom, through the emulator's login pages and
``auth/getuserinfo``: roles from userids and departments, forged, replayed and foreign states
and codes refused, the password login turned off, and every attempt in the audit log."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from sqlalchemy import select

from app.models import AdminSession, AdminUser, AuditEvent
from app.services import Services
from app.sso import roles
from app.web.factory import create_app
from emulator import EmulatorConfig, EmulatorServer
from emulator.state import Fault
from tests.app.web.admin.conftest import PASSWORD, csrf_token, login, post
from tests.support.env import make_env, settings_from


@pytest.fixture
def env(database_url):
    return make_env(DATABASE_URL=database_url, SESSION_COOKIE_SECURE="false")


@pytest.fixture
def emulator(env):
    config = EmulatorConfig(corp_id=env["WECOM_CORP_ID"], secret=env["WECOM_SECRET"],
                            agent_id=int(env["WECOM_AGENT_ID"]), token=env["WECOM_TOKEN"],
                            aes_key=env["WECOM_AES_KEY"])
    with EmulatorServer(config) as server:
        yield server


@pytest.fixture
def settings(env, emulator):
    return settings_from({**env, "WECOM_API_BASE": emulator.url, "WECOM_LOGIN_BASE": emulator.url,
                          "WECOM_OAUTH_BASE": emulator.url, "WECOM_LOGIN_ENABLED": "true"})


@pytest.fixture(autouse=True)
def fresh_sign_ins(settings):
    import redis

    client = redis.Redis.from_url(settings.redis_url)
    for key in client.scan_iter("wecom-login:*"):
        client.delete(key)
    client.close()


def grant(services, kind: str, value: str, role: str) -> None:
    with services.db.transaction() as session:
        roles.set_mapping(session, kind, value, role, created_by="test")


def start(client, user_agent: str = "Mozilla/5.0") -> str:
    """Open 'Sign in with WeCom'; the WeCom page it sends the browser to."""
    response = client.get("/admin/login/wecom", headers={"User-Agent": user_agent})
    assert response.status_code == 302, response.get_data(as_text=True)
    return response.headers["Location"]


def scan(wecom_page: str, userid: str) -> str:
    """The member confirms on the emulator's page: the callback URL WeCom redirects to."""
    query = parse_qs(urlsplit(wecom_page).query)
    page = requests.get(wecom_page, timeout=5)
    assert page.status_code == 200 and "确认登录" in page.text, page.text
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(wecom_page))
    back = requests.post(f"{origin}/_emulator/login/confirm", allow_redirects=False, timeout=5,
                         data={"userid": userid, "redirect_uri": query["redirect_uri"][0],
                               "state": query["state"][0]})
    assert back.status_code == 302, back.text
    return back.headers["Location"]


def come_back(client, callback_url: str):
    parts = urlsplit(callback_url)
    return client.get(f"{parts.path}?{parts.query}")


def sign_in_with_wecom(client, userid: str):
    return come_back(client, scan(start(client), userid))


def wecom_logins(services) -> list[tuple[str, str]]:
    with services.db.session() as session:
        events = session.scalars(select(AuditEvent).where(AuditEvent.event_type == "admin_login")
                                 .order_by(AuditEvent.seq))
        return [(e.actor, e.outcome) for e in events]


def test_a_mapped_userid_signs_in_by_qr_with_its_role_and_is_audited(client, services, emulator):
    grant(services, "user", "ZhangWei", "admin")
    wecom_page = start(client)
    assert wecom_page.startswith(f"{emulator.url}/wwlogin/sso/login?")
    query = parse_qs(urlsplit(wecom_page).query)
    assert query["login_type"] == ["CorpApp"] and query["appid"] == [services.settings.wecom_corp_id]
    assert query["agentid"] == [str(services.settings.wecom_agent_id)]
    assert query["redirect_uri"] == ["http://localhost/admin/login/wecom/callback"]
    response = come_back(client, scan(wecom_page, "zhangwei"))
    assert response.status_code == 302 and response.headers["Location"] == "/admin/"
    page = client.get("/admin/wecom-roles")
    assert page.status_code == 200 and "wecom:zhangwei (admin)" in page.get_data(as_text=True)
    assert wecom_logins(services) == [("admin:wecom:zhangwei", "ok")]
    assert emulator.state.stats["auth/getuserinfo"]["errcode"] == {"0": 1}
    with services.db.session() as session:
        user = session.scalar(select(AdminUser).where(AdminUser.name == "wecom:zhangwei"))
        assert user.role == "admin" and user.last_login_at is not None


def test_a_department_grants_its_members_role(client, services):
    grant(services, "department", "7", "finance")  # 财务部: xuli, sunhao
    assert sign_in_with_wecom(client, "sunhao").status_code == 302
    assert client.get("/admin/dashboard").status_code == 200
    assert client.get("/admin/audit").status_code == 403
    assert client.get("/admin/budgets").status_code == 403


def test_a_userid_row_wins_over_its_department_and_disagreeing_departments_are_refused(
        client, services, emulator):
    grant(services, "department", "7", "finance")
    grant(services, "department", "5", "auditor")
    emulator.state.directory.update_user("xuli", departments=[5, 7])
    refused = sign_in_with_wecom(client, "xuli")
    assert refused.status_code == 403 and "different roles" in refused.get_data(as_text=True)
    assert client.get("/admin/dashboard").status_code == 302  # still anonymous
    grant(services, "user", "xuli", "auditor")
    assert sign_in_with_wecom(client, "xuli").status_code == 302
    assert client.get("/admin/audit").status_code == 200
    assert wecom_logins(services) == [("admin:wecom:xuli", "ambiguous"), ("admin:wecom:xuli", "ok")]


def test_a_member_without_a_role_and_an_outsider_are_refused(client, services):
    grant(services, "department", "7", "finance")
    response = sign_in_with_wecom(client, "lina")
    assert response.status_code == 403 and "no admin role" in response.get_data(as_text=True)
    outsider = sign_in_with_wecom(client, "wechat-outsider")
    assert outsider.status_code == 403 and "Only members" in outsider.get_data(as_text=True)
    assert wecom_logins(services) == [("admin:wecom:lina", "no_role"), ("admin:unknown", "not_member")]
    with services.db.session() as session:
        assert session.scalar(select(AdminUser).where(AdminUser.name == "wecom:lina")) is None


def test_a_replayed_callback_is_refused_in_the_same_and_in_another_browser(app, client, services):
    grant(services, "user", "zhangwei", "admin")
    callback = scan(start(client), "zhangwei")
    assert come_back(client, callback).status_code == 302
    client.post("/admin/logout", data={"csrf_token": csrf_token(client, "/admin/users")})
    again = come_back(client, callback)  # the same browser: its started sign-in is used up
    assert again.status_code == 400 and "expired or was already used" in again.get_data(as_text=True)
    # Another browser that started a sign-in of its own, given the used code and state:
    other = app.test_client()
    start(other)
    assert come_back(other, callback).status_code == 400
    assert client.get("/admin/dashboard").status_code == 302
    assert other.get("/admin/dashboard").status_code == 302
    assert [o for _, o in wecom_logins(services)] == ["ok", "logout", "no_session", "bad_state"]


def test_a_code_is_good_once_even_with_a_fresh_state(app, client, services):
    grant(services, "user", "zhangwei", "admin")
    callback = scan(start(client), "zhangwei")
    assert come_back(client, callback).status_code == 302
    code = parse_qs(urlsplit(callback).query)["code"][0]
    attacker = app.test_client()
    state = parse_qs(urlsplit(start(attacker)).query)["state"][0]  # a state of its own
    replay = attacker.get(f"/admin/login/wecom/callback?code={code}&state={state}")
    assert replay.status_code == 400
    assert attacker.get("/admin/dashboard").status_code == 302
    assert wecom_logins(services)[-1] == ("admin:unknown", "code_replayed")


def test_a_forged_state_is_refused_and_spends_the_started_sign_in(client, services):
    grant(services, "user", "zhangwei", "admin")
    callback = scan(start(client), "zhangwei")
    parts = urlsplit(callback)
    query = parse_qs(parts.query)
    forged = client.get(f"{parts.path}?code={query['code'][0]}&state=forged-{query['state'][0][:8]}")
    assert forged.status_code == 400
    assert come_back(client, callback).status_code == 400  # the genuine one is gone with it
    assert client.get("/admin/dashboard").status_code == 302
    assert [o for _, o in wecom_logins(services)] == ["bad_state", "no_session"]


def test_a_callback_in_a_browser_that_never_started_is_refused(app, client, services):
    """Login CSRF: an attacker's own code and state, planted in the victim's browser."""
    grant(services, "user", "zhangwei", "admin")
    callback = scan(start(client), "zhangwei")  # the attacker's browser
    victim = app.test_client()
    assert come_back(victim, callback).status_code == 400
    assert victim.get("/admin/dashboard").status_code == 302
    assert wecom_logins(services) == [("admin:unknown", "no_session")]


def test_a_code_wecom_refuses_and_wecom_down(client, services, emulator):
    grant(services, "user", "zhangwei", "admin")
    emulator.state.push_fault("auth/getuserinfo", Fault(http_status=503))
    down = sign_in_with_wecom(client, "zhangwei")
    assert down.status_code == 503 and "did not answer" in down.get_data(as_text=True)
    emulator.state.push_fault("auth/getuserinfo", Fault(errcode=40029))
    assert sign_in_with_wecom(client, "zhangwei").status_code == 400
    assert [o for _, o in wecom_logins(services)] == ["wecom_down", "bad_code"]
    assert sign_in_with_wecom(client, "zhangwei").status_code == 302


def test_inside_the_wecom_client_oauth_is_used(client, services, emulator):
    grant(services, "user", "chenjing", "auditor")
    wecom_page = start(client, user_agent="Mozilla/5.0 wxwork/4.1.22 MicroMessenger/7.0.1")
    assert wecom_page.startswith(f"{emulator.url}/connect/oauth2/authorize?")
    assert wecom_page.endswith("#wechat_redirect")
    query = parse_qs(urlsplit(wecom_page.removesuffix("#wechat_redirect")).query)
    assert query["scope"] == ["snsapi_base"] and query["response_type"] == ["code"]
    response = come_back(client, scan(wecom_page.removesuffix("#wechat_redirect"), "chenjing"))
    assert response.status_code == 302 and client.get("/admin/audit").status_code == 200


def test_next_is_kept_through_wecom_and_only_inside_the_admin_area(client, services):
    grant(services, "user", "zhangwei", "admin")
    page = client.get("/admin/login/wecom?next=/admin/budgets").headers["Location"]
    assert come_back(client, scan(page, "zhangwei")).headers["Location"] == "/admin/budgets"
    other = client.application.test_client()
    page = other.get("/admin/login/wecom?next=//evil.example/admin/").headers["Location"]
    assert come_back(other, scan(page, "zhangwei")).headers["Location"] == "/admin/"


def test_a_disabled_wecom_account_stays_out_and_no_password_opens_it(client, services, users):
    grant(services, "user", "zhangwei", "admin")
    assert sign_in_with_wecom(client, "zhangwei").status_code == 302
    assert login(client, "wecom:zhangwei", PASSWORD).status_code == 401
    with services.db.transaction() as session:
        session.scalar(select(AdminUser).where(AdminUser.name == "wecom:zhangwei")).enabled = False
    refused = sign_in_with_wecom(client, "zhangwei")
    assert refused.status_code == 403 and "turned off" in refused.get_data(as_text=True)


def test_changing_a_mapping_ends_the_sessions_it_granted(app, client, services, users):
    grant(services, "user", "zhangwei", "admin")
    wecom_admin = app.test_client()
    assert sign_in_with_wecom(wecom_admin, "zhangwei").status_code == 302
    assert login(client, "alice").status_code == 302  # a password admin changes the row
    response = post(client, "/admin/wecom-roles", {"kind": "user", "value": "zhangwei", "role": "auditor"})
    assert response.status_code == 302
    assert wecom_admin.get("/admin/budgets").status_code == 302  # signed out
    assert sign_in_with_wecom(wecom_admin, "zhangwei").status_code == 302
    assert wecom_admin.get("/admin/budgets").status_code == 403
    assert wecom_admin.get("/admin/audit").status_code == 200
    with services.db.session() as session:
        assert session.scalar(select(AdminUser.role).where(AdminUser.name == "wecom:zhangwei")) == "auditor"


def test_the_roles_page_validates_and_removes(client, services, users):
    assert login(client, "alice").status_code == 302
    bad = post(client, "/admin/wecom-roles", {"kind": "department", "value": "rd", "role": "admin"})
    assert bad.status_code == 400 and "department id is a positive number" in bad.get_data(as_text=True)
    assert post(client, "/admin/wecom-roles", {"kind": "department", "value": "7",
                                               "role": "finance"}).status_code == 302
    with services.db.session() as session:
        (row,) = roles.all_mappings(session)
    page = client.get("/admin/wecom-roles").get_data(as_text=True)
    assert "finance" in page and "set by" in page
    assert post(client, f"/admin/wecom-roles/{row.id}/delete", {}, "/admin/wecom-roles").status_code == 302
    with services.db.session() as session:
        assert roles.all_mappings(session) == []
        changes = [e.actor for e in session.scalars(select(AuditEvent).where(
            AuditEvent.event_type == "admin_change"))]
    assert changes == ["admin:alice", "admin:alice"]
    assert login(client, "fiona").status_code == 302
    assert client.get("/admin/wecom-roles").status_code == 403


def test_wecom_sign_in_off_is_not_found(database_url, db, users):
    settings = settings_from(make_env(DATABASE_URL=database_url, SESSION_COOKIE_SECURE="false",
                                      WECOM_LOGIN_ENABLED="false"))
    client = create_app(services=Services(settings, db)).test_client()
    assert client.get("/admin/login/wecom").status_code == 404
    assert client.get("/admin/login/wecom/callback?code=a&state=b").status_code == 404
    assert "Sign in with WeCom" not in client.get("/admin/login").get_data(as_text=True)


def test_password_login_turned_off(database_url, db, users, emulator):
    settings = settings_from(make_env(DATABASE_URL=database_url, SESSION_COOKIE_SECURE="false",
                                      ADMIN_LOCAL_LOGIN="false"))
    services = Services(settings, db)
    client = create_app(services=services).test_client()
    page = client.get("/admin/login").get_data(as_text=True)
    assert "Sign in with WeCom" in page and 'name="password"' not in page
    # A right password with a valid CSRF token (the form from before the switch): refused, audited.
    refused = client.post("/admin/login", data={"name": "alice", "password": PASSWORD,
                                                "csrf_token": _token_for(client, settings)})
    assert refused.status_code == 403 and "turned off" in refused.get_data(as_text=True)
    assert client.get("/admin/dashboard").status_code == 302
    with db.session() as session:
        assert session.scalar(select(AdminSession)) is None
    assert wecom_logins(services) == [("admin:unknown", "password_off")]


def _token_for(client, settings) -> str:
    """A CSRF token for the client's session, made as Flask-WTF makes them (the page that would
    show one no longer has the form)."""
    from itsdangerous import URLSafeTimedSerializer

    with client.session_transaction("/admin/login") as session:
        session["csrf_token"] = "a" * 40
    return URLSafeTimedSerializer(settings.secret_key.get_secret_value(), salt="wtf-csrf-token").dumps("a" * 40)


def test_with_the_state_store_down_nothing_is_accepted(client, services, emulator):
    import redis

    grant(services, "user", "zhangwei", "admin")
    callback = scan(start(client), "zhangwei")
    services.__dict__["redis"] = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    down = come_back(client, callback)
    assert down.status_code == 503 and "unavailable" in down.get_data(as_text=True)
    assert client.get("/admin/login/wecom").status_code == 503
    assert client.get("/admin/dashboard").status_code == 302
    assert wecom_logins(services) == [("admin:unknown", "store_down")]
    assert emulator.state.stats.get("auth/getuserinfo") is None  # WeCom was never asked
