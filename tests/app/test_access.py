"""Access control over every route the app has, read from ``app.url_map``.

A route added later is covered without editing this file: every ``/admin`` URL (the exports
included) must send anonymous users to the login page, every role-restricted one must answer 403
to the other roles, every ``/v1`` URL must answer 401 without a key, and no route may be left
unprotected unless it is on the short public list below. Sessions expire, and a disabled account's
session ends at once. With the database down, routes answer 503, never 500.
"""

import itertools
import re

import itsdangerous
import pytest
from werkzeug.routing import AnyConverter, IntegerConverter

from app import migrate
from app.models import AdminRole, AdminUser
from app.services import Services
from app.web.admin.accounts import create_user
from app.web.factory import create_app
from tests.app.web.admin.conftest import PASSWORD
from tests.app.web.admin.conftest import login as login_with_token
from tests.support.env import make_env, settings_from

pytestmark = pytest.mark.faults

# The callbacks are signed instead; health holds no data; /metrics answers loopback or its bearer
# token only (tests/app/metrics/test_metrics_collectors.py), and this test client is loopback.
PUBLIC = {"static", "health.healthz", "health.readyz", "metrics.metrics", "admin.static",
          "admin.login", "wecom.verify_url", "wecom.receive", "aibot.verify_url", "aibot.receive",
          # signing in with WeCom: anyone starts one; its callback checks state, verifier and code
          "admin.wecom_login", "admin.wecom_callback"}
LOGIN_ONLY = {"admin.index", "admin.logout"}  # any signed-in role; they hold no data
ROLES = (AdminRole.ADMIN, AdminRole.FINANCE, AdminRole.AUDITOR)
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


@pytest.fixture
def services(tmp_path):
    url = f"sqlite:///{tmp_path / 'access.sqlite3'}"
    migrate.upgrade(url)
    return Services(settings_from(make_env(DATABASE_URL=url, SESSION_COOKIE_SECURE="false")))


@pytest.fixture
def app(services):
    flask_app = create_app(services=services)
    # CSRF has its own tests (tests/app/web/admin/test_auth.py); here the role check must be what refuses.
    flask_app.config.update(TESTING=True, WTF_CSRF_ENABLED=False)
    with services.db.transaction() as session:
        for role in ROLES:
            create_user(session, f"user-{role}", role, PASSWORD)
    return flask_app


def login(client, name):
    return client.post("/admin/login", data={"name": name, "password": PASSWORD})


def urls(app):
    """(endpoint, method, concrete url) for every rule and method, placeholders filled in."""
    for rule in app.url_map.iter_rules():
        url = rule.rule
        for name, converter in rule._converters.items():
            if isinstance(converter, AnyConverter):
                value = re.findall(r"\w+", converter.regex)[0]
            elif isinstance(converter, IntegerConverter):
                value = "1"
            else:
                value = "x.txt"
            url = re.sub(rf"<[^>]*\b{name}>", value, url)
        for method in sorted(rule.methods & set(METHODS)):
            yield rule.endpoint, method, url


def roles_of(app, endpoint):
    return getattr(app.view_functions[endpoint], "roles", None)


def test_every_route_is_public_by_name_or_protected(app):
    unprotected = sorted({e for e, _, _ in urls(app) if e not in PUBLIC | LOGIN_ONLY
                          and not e.startswith("api.") and roles_of(app, e) is None})
    assert unprotected == [], "add @roles_required (or list the route as public on purpose)"


def test_anonymous_users_are_sent_to_login_or_refused(app):
    client = app.test_client()
    checked = 0
    for endpoint, method, url in urls(app):
        if endpoint in PUBLIC:
            continue
        response = client.open(url, method=method)
        if endpoint.startswith("api."):
            assert response.status_code == 401, (method, url, response.status_code)
        else:
            assert response.status_code == 302, (method, url, response.status_code)
            assert response.headers["Location"].startswith("/admin/login"), (method, url)
        checked += 1
    assert checked >= 20


def test_wrong_roles_get_403_on_every_restricted_route(app):
    checked = 0
    for role in ROLES:
        client = app.test_client()
        assert login(client, f"user-{role}").status_code == 302
        for endpoint, method, url in urls(app):
            roles = roles_of(app, endpoint)
            if roles is None or role in roles:
                continue
            response = client.open(url, method=method)
            assert response.status_code == 403, (role, method, url, response.status_code)
            checked += 1
    assert checked >= 20


def test_allowed_roles_are_let_in_to_every_page(app):
    app.config["WTF_CSRF_ENABLED"] = True  # the forms render their token
    for role in ROLES:
        client = app.test_client()
        assert login_with_token(client, f"user-{role}").status_code == 302
        for endpoint, method, url in urls(app):
            roles = roles_of(app, endpoint)
            if method == "GET" and roles and role in roles and "<" not in url:
                status = client.get(url).status_code
                assert status in (200, 404), (role, url, status)  # 404: the placeholder id 1


def test_sessions_expire(app, services, monkeypatch):
    client = app.test_client()
    assert login(client, "user-admin").status_code == 302
    assert client.get("/admin/dashboard").status_code == 200
    hours = services.settings.admin_session_hours
    real = itsdangerous.TimestampSigner.get_timestamp
    monkeypatch.setattr(itsdangerous.TimestampSigner, "get_timestamp",
                        lambda self: real(self) + hours * 3600 + 60)
    response = client.get("/admin/dashboard")
    assert response.status_code == 302 and response.headers["Location"].startswith("/admin/login")


def test_a_disabled_account_is_signed_out_at_once(app, services):
    client = app.test_client()
    assert login(client, "user-finance").status_code == 302
    assert client.get("/admin/dashboard").status_code == 200
    with services.db.transaction() as session:
        session.query(AdminUser).filter_by(name="user-finance").update({"enabled": False})
    assert client.get("/admin/dashboard").status_code == 302


def test_database_down_is_503_never_500():
    dead = make_env(DATABASE_URL="postgresql+psycopg://postgres@127.0.0.1:1/none",
                    SESSION_COOKIE_SECURE="false")
    app = create_app(services=Services(settings_from(dead)))
    app.config.update(WTF_CSRF_ENABLED=False)
    client = app.test_client()
    response = client.post("/admin/login", data={"name": "alice", "password": PASSWORD})
    assert response.status_code == 503 and "retry" in response.get_json()["error"]
    bearer = {"Authorization": "Bearer sk-" + "x" * 40}
    for method, url in itertools.product(("GET", "POST"), ("/v1/models", "/v1/chat/completions")):
        status = client.open(url, method=method, headers=bearer,
                             json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).status_code
        assert status in (503, 405), (method, url, status)
