"""One gunicorn-served API per module and database kind (``tests.support.api_server``); each
test gets its own API key, so the rate limits and budgets of one test do not touch another."""

from __future__ import annotations

import psycopg
import pytest

from tests.support import postgres
from tests.support.api_server import MODEL, ApiServer

__all__ = ["MODEL"]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def api(request, tmp_path_factory):
    try:
        server = ApiServer(tmp_path_factory.mktemp("api"), db_kind=request.param)
    except psycopg.OperationalError as exc:
        postgres.unreachable(exc)
    yield server
    server.stop()


@pytest.fixture
def key(api):
    return api.new_key()


@pytest.fixture
def client(api, key):
    return api.client(key[1])
