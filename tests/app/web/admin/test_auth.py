"""Login, roles, CSRF, lockout, cookie flags, and the audit events they leave."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.db import utcnow
from app.models import AdminUser, AuditEvent
from tests.app.web.admin.conftest import PASSWORD, csrf_token, login


def test_anonymous_is_sent_to_the_login_page(client):
    for path in ("/admin/", "/admin/dashboard", "/admin/budgets", "/admin/audit"):
        response = client.get(path)
        assert response.status_code == 302
        assert response.headers["Location"].startswith("/admin/login")


def test_login_sets_a_hardened_cookie_and_is_audited(client, users, services):
    response = login(client, "alice")
    assert response.status_code == 302 and response.headers["Location"] == "/admin/"
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert client.get("/admin/dashboard").status_code == 200
    assert login(client, "alice", "wrong password!").status_code == 401
    with services.db.session() as session:
        events = [(e.event_type, e.actor, e.outcome) for e in session.scalars(
            select(AuditEvent).where(AuditEvent.event_type == "admin_login").order_by(AuditEvent.seq))]
    assert events == [("admin_login", "admin:alice", "ok"),
                      ("admin_login", "admin:alice", "bad_password")]


def test_cookie_is_secure_by_default():
    from tests.support.env import make_env, settings_from

    assert settings_from(make_env()).session_cookie_secure is True


def test_roles(as_role):
    client = as_role("finance")
    assert client.get("/admin/dashboard").status_code == 200
    forbidden = client.get("/admin/audit")
    assert forbidden.status_code == 403 and "403" in forbidden.get_data(as_text=True)
    assert client.get("/admin/budgets").status_code == 403


def test_auditor_cannot_open_budgets(as_role):
    client = as_role("auditor")
    assert client.get("/admin/audit").status_code == 200
    assert client.get("/admin/budgets").status_code == 403
    assert client.get("/admin/dashboard").status_code == 403


def test_missing_or_forged_csrf_token_is_refused(client, users):
    data = {"name": "alice", "password": PASSWORD}
    assert client.post("/admin/login", data=data).status_code == 400
    assert client.post("/admin/login", data={**data, "csrf_token": "forged"}).status_code == 400
    csrf_token(client, "/admin/login")  # a real session, still a wrong token
    assert client.post("/admin/login", data={**data, "csrf_token": "IjEi.forged"}).status_code == 400


def test_wecom_callback_stays_exempt_from_csrf(client):
    # No CSRF error: the callback answers for itself (a missing signature is its own 400).
    response = client.post("/wecom/callback", data=b"<xml/>")
    assert "CSRF" not in response.get_data(as_text=True)


def test_lockout_after_five_failures(client, users, services):
    for _ in range(5):
        assert login(client, "fiona", "not the password").status_code == 401
    locked = login(client, "fiona")
    assert locked.status_code == 401 and "locked" in locked.get_data(as_text=True)
    with services.db.transaction() as session:
        user = session.scalar(select(AdminUser).where(AdminUser.name == "fiona"))
        assert user.locked_until > utcnow() + timedelta(minutes=14)
        user.locked_until = utcnow() - timedelta(seconds=1)  # the 15 minutes are over
    assert login(client, "fiona").status_code == 302
    with services.db.session() as session:
        outcomes = list(session.scalars(select(AuditEvent.outcome).where(
            AuditEvent.event_type == "admin_login").order_by(AuditEvent.seq)))
    assert outcomes == ["bad_password"] * 5 + ["locked", "ok"]


def test_users_create_cli(app, services):
    runner = app.test_cli_runner()
    result = runner.invoke(args=["users", "create", "carol", "--role", "auditor"],
                           input="a long enough password\na long enough password\n")
    assert result.exit_code == 0, result.output
    assert "carol (auditor) created" in result.output
    short = runner.invoke(args=["users", "create", "dave", "--role", "admin"], input="short\nshort\n")
    assert short.exit_code != 0 and "at least 12" in short.output
    with services.db.session() as session:
        user = session.scalar(select(AdminUser).where(AdminUser.name == "carol"))
    assert user.role == "auditor" and user.password_hash.startswith("$argon2id$")


def test_admin_manages_accounts(as_role, services, app):
    from tests.app.web.admin.conftest import post

    client = as_role("admin")
    short = post(client, "/admin/users", {"name": "bob", "role": "finance", "password": "short",
                                          "confirm": "short"})
    assert short.status_code == 400 and "at least 12 characters" in short.get_data(as_text=True)
    created = post(client, "/admin/users", {"name": "bob", "role": "finance",
                                            "password": PASSWORD, "confirm": PASSWORD})
    assert created.status_code == 302
    with services.db.session() as session:
        bob = session.scalar(select(AdminUser).where(AdminUser.name == "bob"))
    assert post(client, f"/admin/users/{bob.id}/disable", {}, form_page="/admin/users").status_code == 302
    assert login(app.test_client(), "bob").status_code == 401  # disabled
    assert client.get("/admin/users").status_code == 200


def test_only_admins_manage_accounts(as_role):
    assert as_role("auditor").get("/admin/users").status_code == 403


def test_admin_pages_send_security_headers(client):
    response = client.get("/admin/login")
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Cache-Control"] == "no-store"
    assert client.get("/healthz").headers.get("X-Frame-Options") is None  # only the admin area


def test_only_the_admin_area_opens_cookie_sessions(app, client, as_role):
    interface = app.session_interface
    for path in ("/admin", "/admin/", "/admin/login"):
        with app.test_request_context(path) as ctx:
            assert not interface.is_null_session(interface.open_session(app, ctx.request))
    for path in ("/wecom/callback", "/wecom/aibot", "/v1/chat/completions", "/healthz", "/administrator"):
        with app.test_request_context(path) as ctx:
            assert interface.open_session(app, ctx.request) is None
    as_role("admin")  # a logged-in browser's cookie is neither read nor refreshed elsewhere
    assert "Set-Cookie" not in client.get("/healthz").headers


def _copy_cookie(app, client):
    """A second browser holding the first one's session cookie, as a thief would."""
    thief = app.test_client()
    cookie = client.get_cookie("wecom_admin", path="/")
    assert cookie is not None
    thief.set_cookie("wecom_admin", cookie.value, path="/")
    return thief


def test_logout_revokes_the_session_server_side(app, as_role):
    client = as_role("admin")
    thief = _copy_cookie(app, client)
    assert thief.get("/admin/dashboard").status_code == 200  # the copy works while signed in
    token = csrf_token(client, "/admin/dashboard")
    assert client.post("/admin/logout", data={"csrf_token": token}).status_code == 302
    refused = thief.get("/admin/dashboard")
    assert refused.status_code == 302 and refused.headers["Location"].startswith("/admin/login")
    assert client.get("/admin/dashboard").status_code == 302


def test_session_lifetime_is_absolute_not_sliding(app, as_role, settings, monkeypatch):
    import app.web.admin.sessions as sessions

    started = utcnow()
    client = as_role("finance")
    lifetime = timedelta(hours=settings.admin_session_hours)
    step = timedelta(minutes=20)
    at = started
    while at + step < started + lifetime - timedelta(minutes=1):  # used all day, every 20 minutes
        at += step
        monkeypatch.setattr(sessions, "utcnow", lambda at=at: at)
        assert client.get("/admin/dashboard").status_code == 200, at - started
    monkeypatch.setattr(sessions, "utcnow", lambda: started + lifetime + timedelta(seconds=1))
    refused = client.get("/admin/dashboard")
    assert refused.status_code == 302 and refused.headers["Location"].startswith("/admin/login")


def test_a_cookie_signed_with_the_key_but_never_issued_is_refused(app, users, services):
    # Whoever learns SECRET_KEY can sign any cookie; without a session this server issued,
    # it opens nothing, even while the account is signed in elsewhere.
    assert login(app.test_client(), "alice").status_code == 302
    with services.db.session() as session:
        alice = session.scalar(select(AdminUser).where(AdminUser.name == "alice"))
    serializer = app.session_interface.get_signing_serializer(app)
    forged = serializer.dumps({"_user_id": str(alice.id), "_fresh": True, "sid": "guessed"})
    client = app.test_client()
    client.set_cookie("wecom_admin", forged, path="/")
    assert client.get("/admin/dashboard").status_code == 302


def test_disabling_an_account_ends_its_sessions(app, as_role, users, services):
    from tests.app.web.admin.conftest import post

    fiona = app.test_client()
    assert login(fiona, "fiona").status_code == 302
    admin = as_role("admin")
    with services.db.session() as session:
        fiona_id = session.scalar(select(AdminUser.id).where(AdminUser.name == "fiona"))
    for change in ("disable", "enable"):
        assert post(admin, f"/admin/users/{fiona_id}/{change}", {},
                    form_page="/admin/users").status_code == 302
    assert fiona.get("/admin/dashboard").status_code == 302  # enabled again, yet signed out
