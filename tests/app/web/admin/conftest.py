"""The admin area on both databases (the data layer's fixtures), through Flask's test client.

CSRF protection stays on: ``login`` and ``post`` read the token from the rendered form, as a
browser would. Argon2 runs with its real parameters (a few hash checks per test).
"""

from __future__ import annotations

import re

import pytest

from app.services import Services
from app.web.admin.accounts import create_user
from app.web.factory import create_app
from tests.support.env import make_env, settings_from

PASSWORD = "correct horse battery"
TOKEN = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')


@pytest.fixture
def settings(database_url):  # noqa: F811
    return settings_from(make_env(DATABASE_URL=database_url, SESSION_COOKIE_SECURE="false"))


@pytest.fixture
def services(settings, db):  # noqa: F811
    return Services(settings, db)


@pytest.fixture(autouse=True)
def fresh_login_limits(settings):
    """Failed logins count per address and minute in Redis; each test starts from none."""
    import redis

    client = redis.Redis.from_url(settings.redis_url)
    for key in client.scan_iter("ratelimit:admin-login:*"):
        client.delete(key)
    client.close()


@pytest.fixture
def app(services):
    flask_app = create_app(services=services)
    flask_app.config["TESTING"] = True
    return flask_app


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def users(services):
    with services.db.transaction() as session:
        for name, role in (("alice", "admin"), ("fiona", "finance"), ("otto", "auditor")):
            create_user(session, name, role, PASSWORD)
    return {"admin": "alice", "finance": "fiona", "auditor": "otto"}


def csrf_token(client, path: str) -> str:
    page = client.get(path)
    match = TOKEN.search(page.get_data(as_text=True))
    assert match, f"no CSRF token on {path}"
    return match.group(1)


def login(client, name: str, password: str = PASSWORD):
    token = csrf_token(client, "/admin/login")
    return client.post("/admin/login", data={"name": name, "password": password,
                                              "csrf_token": token})


def post(client, path: str, data: dict, form_page: str | None = None):
    """POST a form the way the browser would: with the token of the page that shows it."""
    token = csrf_token(client, form_page or path)
    return client.post(path, data={**data, "csrf_token": token})


@pytest.fixture
def as_role(client, users):
    def sign_in(role: str):
        response = login(client, users[role])
        assert response.status_code == 302, response.get_data(as_text=True)
        return client

    return sign_in
