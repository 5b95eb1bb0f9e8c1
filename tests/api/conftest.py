"""One gunicorn-served API per module (``tests.support.api_server``); each test gets its own API
key, so the rate limits and budgets of one test do not touch another."""

from __future__ import annotations

import pytest

from tests.support.api_server import MODEL, ApiServer

__all__ = ["MODEL"]


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    server = ApiServer(tmp_path_factory.mktemp("api"))
    yield server
    server.stop()


@pytest.fixture
def key(api):
    return api.new_key()


@pytest.fixture
def client(api, key):
    return api.client(key[1])
