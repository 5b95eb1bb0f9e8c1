"""The data layer's fixtures (a plugin: tests/conftest.py registers it). A test that asks for
``database_url`` (or what builds on it: ``env``, ``settings``, ``db``, ``services``) runs twice:
on a fresh SQLite file and on a throwaway PostgreSQL database.

PostgreSQL is the real server at 127.0.0.1:5432 (``DATA_TEST_PG`` overrides); each test gets its
own database, migrated from empty with Alembic, and dropped afterwards. An unreachable server fails
the PostgreSQL variants; ``TESTS_WITHOUT_POSTGRES=1`` skips them (tests/support/postgres.py).
``redis_client`` and ``env``'s REDIS_URL are DB 14.
"""

from __future__ import annotations

import os
import uuid

import pytest
import redis
import sqlalchemy as sa

from app import migrate
from app.db import Database
from app.services import Services
from tests.support import postgres
from tests.support.env import make_env, redis_url, settings_from

PG_SERVER = postgres.SERVER
REDIS_URL = os.environ.get("DATA_TEST_REDIS", redis_url(14))


def _admin_engine():
    return sa.create_engine(PG_SERVER, isolation_level="AUTOCOMMIT",
                            connect_args={"connect_timeout": 3})


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'data.sqlite3'}"
        migrate.upgrade(url)
        yield url
        return
    postgres.skip_if_opted_out()
    name = f"data_test_{uuid.uuid4().hex[:12]}"
    admin = _admin_engine()
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        postgres.unreachable(exc)
    url = PG_SERVER.rsplit("/", 1)[0] + f"/{name}"
    try:
        migrate.upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def env(database_url):
    return make_env(DATABASE_URL=database_url, REDIS_URL=REDIS_URL)


@pytest.fixture
def settings(env):
    return settings_from(env)


@pytest.fixture
def db(database_url):
    database = Database(database_url)
    yield database
    database.dispose()


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def services(settings, db, redis_client):
    return Services(settings, db)
