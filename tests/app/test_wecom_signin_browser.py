"""Signing in with WeCom in headless Chromium: the admin site under gunicorn sends the browser
to the emulator's QR login page, a member "scans" and confirms, and the browser lands in the
admin area with the role its mapping grants; the same page with the password login turned off."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.models import AuditEvent
from app.sso import roles
from emulator import EmulatorConfig, EmulatorServer
from tests.support.browser import CHROMIUM
from tests.support.env import make_env

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def emulator():
    env = make_env()
    config = EmulatorConfig(corp_id=env["WECOM_CORP_ID"], secret=env["WECOM_SECRET"],
                            agent_id=int(env["WECOM_AGENT_ID"]), token=env["WECOM_TOKEN"],
                            aes_key=env["WECOM_AES_KEY"])
    with EmulatorServer(config) as server:
        yield server


@pytest.fixture(scope="module")
def site(tmp_path_factory, emulator):
    """The browser fixtures' site, its WeCom (API and login pages) the emulator."""
    from pathlib import Path

    from tests.support.admin_site import AdminSite

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    cfg = emulator.state.config
    server = AdminSite(tmp_path_factory.mktemp("wecom-signin-site"), WECOM_CORP_ID=cfg.corp_id,
                       WECOM_API_BASE=emulator.url, WECOM_LOGIN_BASE=emulator.url,
                       WECOM_OAUTH_BASE=emulator.url, WECOM_LOGIN_ENABLED="true")
    with server.services.db.transaction() as session:
        roles.set_mapping(session, "department", "7", "finance", "test")  # 财务部
        roles.set_mapping(session, "user", "zhouting", "auditor", "test")
    yield server
    server.stop()


def test_a_member_signs_in_by_wecom_qr_and_gets_the_mapped_role(page, site, emulator):
    page.goto("/admin/dashboard")
    assert "/admin/login" in page.url
    page.click("#wecom-login")
    page.wait_for_url(f"{emulator.url}/wwlogin/sso/login?*")
    assert "企业微信登录" in page.inner_text("h1")
    page.check("input[value=xuli]")  # 徐丽, 财务部: finance
    page.click("#confirm")
    page.wait_for_url("**/admin/dashboard")
    assert "wecom:xuli (finance)" in page.inner_text("header")
    assert page.goto("/admin/audit").status == 403
    page.goto("/admin/dashboard")
    page.click("button:has-text('Sign out')")
    page.wait_for_url("**/admin/login")
    with site.services.db.session() as session:
        events = [(e.actor, e.outcome) for e in session.scalars(
            select(AuditEvent).where(AuditEvent.event_type == "admin_login").order_by(AuditEvent.seq))]
    assert events[-2:] == [("admin:wecom:xuli", "ok"), ("admin:wecom:xuli", "logout")]


def test_a_member_without_a_role_is_told_so_and_stays_out(page, emulator):
    page.goto("/admin/login")
    page.click("#wecom-login")
    page.wait_for_url(f"{emulator.url}/wwlogin/sso/login?*")
    page.check("input[value=lina]")
    page.click("#confirm")
    page.wait_for_url("**/admin/login/wecom/callback?*")
    assert "no admin role" in page.inner_text("main")
    assert "/admin/login" in page.goto("/admin/dashboard").url


def test_going_back_to_a_used_sign_in_is_refused(page, emulator):
    callbacks = []
    page.on("request", lambda r: callbacks.append(r.url) if "/admin/login/wecom/callback" in r.url else None)
    page.goto("/admin/login")
    page.click("#wecom-login")
    page.wait_for_url(f"{emulator.url}/wwlogin/sso/login?*")
    page.check("input[value=zhouting]")
    page.click("#confirm")
    page.wait_for_url("**/admin/audit")  # an auditor's first page
    page.click("button:has-text('Sign out')")
    page.wait_for_url("**/admin/login")
    (callback,) = callbacks
    response = page.goto(callback)  # the history's entry, or a copied link
    assert response.status == 400 and "already used" in page.inner_text("main")
    assert "/admin/login" in page.goto("/admin/audit").url
