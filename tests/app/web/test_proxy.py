"""``TRUSTED_PROXIES``: forwarded headers are believed only for the configured number of hops."""

from __future__ import annotations

import pytest
from flask import request

from app.config import ConfigError
from app.web.factory import create_app
from app.web.proxy import trust_proxies
from tests.support.env import make_env, settings_from

FORWARDED = {"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https",
             "X-Forwarded-Host": "bot.example.com", "X-Forwarded-Port": "443"}


def client(**env):
    app = create_app(settings_from(make_env(**env)))
    app.add_url_rule("/_seen", "seen", lambda: {"ip": request.remote_addr, "url": request.url})
    return app.test_client()


def test_forwarded_headers_ignored_by_default():
    seen = client().get("/_seen", headers=FORWARDED, environ_base={"REMOTE_ADDR": "10.0.0.2"}).get_json()
    assert seen == {"ip": "10.0.0.2", "url": "http://localhost/_seen"}


def test_one_trusted_proxy_gives_the_client_address_scheme_and_host():
    seen = client(TRUSTED_PROXIES="1").get("/_seen", headers=FORWARDED,
                                          environ_base={"REMOTE_ADDR": "10.0.0.2"}).get_json()
    assert seen == {"ip": "203.0.113.7", "url": "https://bot.example.com/_seen"}


def test_a_forged_hop_before_the_proxy_is_not_believed():
    headers = {**FORWARDED, "X-Forwarded-For": "6.6.6.6, 203.0.113.7"}  # client forged the first
    seen = client(TRUSTED_PROXIES="1").get("/_seen", headers=headers,
                                          environ_base={"REMOTE_ADDR": "10.0.0.2"}).get_json()
    assert seen["ip"] == "203.0.113.7"


def test_negative_count_is_a_config_error():
    with pytest.raises(ConfigError, match="TRUSTED_PROXIES"):
        settings_from(make_env(TRUSTED_PROXIES="-1"))
    with pytest.raises(ValueError):
        trust_proxies(None, -1)
