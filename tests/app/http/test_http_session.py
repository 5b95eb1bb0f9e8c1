"""app.http.session: the environment requests would read per request, read once per session."""

from __future__ import annotations

from app.http.session import POOL_CONNECTIONS, session_for

BASE = "https://qyapi.weixin.qq.com"


def _clear(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                 "all_proxy", "no_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)


def test_the_proxies_of_the_environment_apply_and_are_not_read_again(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    session = session_for(BASE)
    assert session.trust_env is False
    assert session.proxies["https"] == "http://proxy.example:3128"
    # what requests would pick for the service's URL with these settings
    merged = session.merge_environment_settings(f"{BASE}/cgi-bin/message/send", {}, None, None, None)
    assert merged["proxies"]["https"] == "http://proxy.example:3128"


def test_no_proxy_for_the_host_means_no_proxy(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", "qyapi.weixin.qq.com")
    assert session_for(BASE).proxies == {}


def test_the_ca_bundle_of_the_environment_is_kept(monkeypatch, tmp_path):
    _clear(monkeypatch)
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    assert session_for(BASE).verify == str(bundle)
    _clear(monkeypatch)
    assert session_for(BASE).verify is True


def test_idle_connections_are_kept_for_every_worker_thread(monkeypatch):
    _clear(monkeypatch)
    adapter = session_for(BASE).get_adapter(BASE)
    assert adapter._pool_maxsize == POOL_CONNECTIONS
