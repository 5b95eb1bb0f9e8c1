"""API keys: only the HMAC is stored, the key authenticates until disabled."""

from __future__ import annotations

import pytest

from app import migrate
from app.db import Database
from app.models import ApiKey
from app.security import BlindIndex
from app.web.api.keys import authenticate, create_key, disable_key, key_hash, list_keys
from tests.support.env import redis_url

INDEX = BlindIndex("k" * 32)


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    migrate.upgrade(url)
    database = Database(url)
    yield database
    database.dispose()


def test_a_key_is_stored_as_its_hmac_only(db):
    with db.transaction() as session:
        row, key = create_key(session, INDEX, "reporting", 7)
    assert key.startswith("sk-") and len(key) > 40
    with db.session() as session:
        stored = session.get(ApiKey, row.id)
        assert stored.key_hash == key_hash(INDEX, key) and key not in stored.key_hash
        assert stored.prefix == key[:10] and stored.rate_limit_per_min == 7


def test_authenticate_then_disable(db):
    with db.transaction() as session:
        _, key = create_key(session, INDEX, "crm")
    caller = authenticate(db, INDEX, key)
    assert caller is not None and caller.name == "crm" and caller.actor == "api_key:crm"
    assert authenticate(db, INDEX, key + "x") is None
    assert authenticate(db, INDEX, None) is None
    assert authenticate(db, BlindIndex("o" * 32), key) is None  # another server's index key
    with db.session() as session:
        assert list_keys(session)[0].last_used_at is not None
    with db.transaction() as session:
        disable_key(session, "crm")
    assert authenticate(db, INDEX, key) is None


def test_names_are_unique_and_limits_positive(db):
    with db.transaction() as session:
        create_key(session, INDEX, "crm")
    with pytest.raises(ValueError, match="exists"), db.transaction() as session:
        create_key(session, INDEX, "crm")
    with pytest.raises(ValueError, match="rate limit"), db.transaction() as session:
        create_key(session, INDEX, "other", 0)


def test_flask_apikeys_create_list_disable(tmp_path):
    from app.web.factory import create_app
    from tests.support.env import make_env, settings_from

    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    migrate.upgrade(url)
    app = create_app(settings_from(make_env(DATABASE_URL=url)))
    runner = app.test_cli_runner()
    created = runner.invoke(args=["apikeys", "create", "crm", "--rate-limit", "9"])
    assert created.exit_code == 0, created.output
    key = created.stdout.strip()
    assert key.startswith("sk-") and "not shown again" in created.stderr
    listed = runner.invoke(args=["apikeys", "list"]).output
    assert "crm" in listed and key[:10] in listed and key not in listed and "9/min" in listed
    assert runner.invoke(args=["apikeys", "disable", "crm"]).exit_code == 0
    assert "\toff\t" in runner.invoke(args=["apikeys", "list"]).output
    assert runner.invoke(args=["apikeys", "disable", "nobody"]).exit_code != 0
    app.extensions["services"].db.dispose()


class _BrokenRedis:
    def pipeline(self):
        raise ConnectionError("down")


def test_rate_limit_window_and_fail_open():
    import redis

    from app.web.api import ratelimit

    client = redis.Redis.from_url(redis_url(13))
    client.delete("ratelimit:api:999:100")
    now = 100 * 60 + 15.0
    assert [ratelimit.check(client, 999, 2, now).allowed for _ in range(3)] == [True, True, False]
    assert ratelimit.check(client, 999, 2, now).retry_after_s == 45
    assert ratelimit.check(client, 999, 2, now + 60).allowed  # the next minute starts afresh
    assert ratelimit.check(_BrokenRedis(), 999, 2, now).allowed
    client.delete("ratelimit:api:999:100", "ratelimit:api:999:101")
    client.close()
