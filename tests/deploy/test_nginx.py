"""docker/nginx/default.conf: TLS 1.3 only, streamed paths unbuffered with a long read timeout,
the client's address and scheme forwarded in headers the app trusts, and nothing that drifts from
the compose file, gunicorn's settings or the app's routes."""

from __future__ import annotations

import re

import pytest

from tests.deploy.conftest import ROOT

STREAMING = ("/v1/", "/wecom/")
FORWARDED = {
    "Host": "$host",
    "X-Real-IP": "$remote_addr",
    "X-Forwarded-For": "$proxy_add_x_forwarded_for",
    "X-Forwarded-Proto": "$scheme",
    "X-Forwarded-Host": "$host",
    "X-Forwarded-Port": "$server_port",
}


def blocks(directives: list[dict], name: str) -> list[dict]:
    return [d for d in directives if d["directive"] == name]


def values(block: list[dict], name: str) -> list[list[str]]:
    return [d["args"] for d in blocks(block, name)]


def one(block: list[dict], name: str) -> list[str]:
    found = values(block, name)
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m|h)?", value)
    assert match, value
    scale = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[match.group(2)]
    return int(match.group(1)) * scale


@pytest.fixture(scope="module")
def tls_server(nginx) -> list[dict]:
    servers = [s["block"] for s in blocks(nginx, "server")
               if any("443" in a[0] and "ssl" in a for a in values(s["block"], "listen"))]
    assert len(servers) == 1
    return servers[0]


def locations(server: list[dict]) -> dict[str, list[dict]]:
    return {" ".join(d["args"]): d["block"] for d in blocks(server, "location")}


def test_tls_13_only_everywhere(nginx, tls_server):
    assert one(tls_server, "ssl_protocols") == ["TLSv1.3"]

    def all_protocols(directives):
        for d in directives:
            if d["directive"] == "ssl_protocols":
                yield d["args"]
            yield from all_protocols(d.get("block", []))

    assert list(all_protocols(nginx)) == [["TLSv1.3"]]


def test_certificates_come_from_the_mounted_folder(tls_server, services):
    assert one(tls_server, "ssl_certificate") == ["/etc/nginx/certs/tls.crt"]
    assert one(tls_server, "ssl_certificate_key") == ["/etc/nginx/certs/tls.key"]
    assert "./docker/nginx/certs:/etc/nginx/certs:ro" in services["nginx"]["volumes"]
    script = (ROOT / "docker" / "nginx" / "make-self-signed-cert.sh").read_text()
    assert '"$dir/tls.crt"' in script and '"$dir/tls.key"' in script


@pytest.mark.parametrize("path", STREAMING)
def test_streaming_paths_are_unbuffered_with_a_long_read_timeout(tls_server, path):
    location = locations(tls_server)[path]
    assert one(location, "proxy_pass") == ["http://api" if path == "/v1/" else "http://web"]
    assert one(location, "proxy_buffering") == ["off"]
    assert seconds(one(location, "proxy_read_timeout")[0]) >= 300
    assert seconds(one(location, "proxy_send_timeout")[0]) >= 300


def test_every_proxied_location_sends_the_real_client_headers(tls_server):
    server_headers = {a[0]: a[1] for a in values(tls_server, "proxy_set_header")}
    proxied = {name: block for name, block in locations(tls_server).items()
               if values(block, "proxy_pass")}
    assert set(STREAMING) <= set(proxied) and "/" in proxied
    for name, block in proxied.items():
        own = {a[0]: a[1] for a in values(block, "proxy_set_header")}
        effective = own or server_headers  # nginx inherits only when a location sets none
        for header, value in FORWARDED.items():
            assert effective.get(header) == value, f"{name}: {header}"


def test_plain_http_only_redirects_and_answers_the_health_check(nginx, services):
    plain = [s["block"] for s in blocks(nginx, "server")
             if all("ssl" not in a for a in values(s["block"], "listen"))]
    assert len(plain) == 1
    locs = locations(plain[0])
    assert set(locs) == {"= /nginx-healthz", "/"}
    assert one(locs["/"], "return")[0] == "301" and one(locs["/"], "return")[1].startswith("https://")
    assert not any(values(block, "proxy_pass") for block in locs.values())
    assert "http://127.0.0.1/nginx-healthz" in services["nginx"]["healthcheck"]["test"]


def test_upstream_is_the_web_service_and_closes_before_gunicorn(nginx, services, gunicorn_conf):
    upstream = one_block(nginx, "upstream", "web")
    assert one(upstream, "server") == ["web:8080"]
    assert "8080" in services["web"]["expose"]
    gunicorn_keepalive = gunicorn_conf["keepalive"]
    assert seconds(one(upstream, "keepalive_timeout")[0]) < gunicorn_keepalive


def test_v1_goes_to_a_gunicorn_apart_from_the_callbacks(nginx, tls_server, services, gunicorn_conf):
    """/v1 streams of a slow model must not hold the threads that answer WeCom (within 5 s)."""
    upstream = one_block(nginx, "upstream", "api")
    assert one(upstream, "server") == ["api:8080"]
    assert seconds(one(upstream, "keepalive_timeout")[0]) < gunicorn_conf["keepalive"]
    proxied = {name: one(block, "proxy_pass")[0] for name, block in locations(tls_server).items()
               if values(block, "proxy_pass")}
    assert [name for name, target in proxied.items() if target == "http://api"] == ["/v1/"]
    api, web = services["api"], services["web"]
    assert api["environment"]["WEB_ROLE"] == "api" and web["environment"]["WEB_ROLE"] == "web"
    assert api["environment"]["WEB_BIND"] == "0.0.0.0:8080" and "8080" in api["expose"]
    assert api["environment"]["INTAKE_SERVER"] == "0"  # no callbacks there to write
    assert services["nginx"]["depends_on"]["api"]["condition"] == "service_healthy"


def one_block(directives: list[dict], name: str, arg: str) -> list[dict]:
    found = [d["block"] for d in blocks(directives, name) if d["args"] == [arg]]
    assert len(found) == 1
    return found[0]


def test_metrics_stay_inside_the_network(tls_server):
    metrics = locations(tls_server)["= /metrics"]
    assert values(metrics, "deny") == [["all"]]
    assert ["0.0.0.0/0"] not in values(metrics, "allow")


def test_the_apps_streaming_routes_fall_under_the_streaming_locations():
    from app.web.factory import create_app
    from tests.support.env import make_env, settings_from

    app = create_app(settings_from(make_env()))
    rules = [r.rule for r in app.url_map.iter_rules()]
    assert "/v1/chat/completions" in rules and "/wecom/callback" in rules
    for rule in rules:
        if rule.startswith(("/v1", "/wecom")):
            assert rule.startswith(STREAMING), f"{rule} would be buffered by nginx"


def size(value: str) -> int:
    match = re.fullmatch(r"(\d+)([kKmM])?", value)
    assert match, value
    return int(match.group(1)) * {None: 1, "k": 1024, "K": 1024, "m": 2**20, "M": 2**20}[match.group(2)]


def test_request_bodies_are_buffered_in_nginx_everywhere(nginx, tls_server):
    # A body passed on as it arrives ties a gunicorn thread to a client trickling its upload:
    # about 72 slow connections held every thread. Every body is read whole by nginx first.
    def every(directives, name):
        for d in directives:
            if d["directive"] == name:
                yield d["args"]
            yield from every(d.get("block", []), name)

    assert all(args == ["on"] for args in every(nginx, "proxy_request_buffering"))
    assert size(one(tls_server, "client_body_buffer_size")[0]) >= 64 * 1024  # CALLBACK_MAX_BYTES
    api = locations(tls_server)["/v1/"]
    assert size(one(api, "client_body_buffer_size")[0]) >= 2**20  # API_MAX_BODY_BYTES in memory


def test_slow_clients_time_out_and_are_limited_per_address(nginx, tls_server):
    for name in ("client_header_timeout", "client_body_timeout"):
        assert seconds(one(tls_server, name)[0]) <= 15, name
    zones = {a[1].split(":")[0].removeprefix("zone="): a for a in values(nginx, "limit_req_zone")}
    conn_zones = {a[1].split(":")[0].removeprefix("zone=") for a in values(nginx, "limit_conn_zone")}
    assert all(a[0] == "$binary_remote_addr" for a in values(nginx, "limit_conn_zone"))
    conn = one(tls_server, "limit_conn")
    assert conn[0] in conn_zones and 0 < int(conn[1]) <= 256
    assert one(tls_server, "limit_conn_status") == one(tls_server, "limit_req_status") == ["429"]
    for name, block in locations(tls_server).items():
        if not values(block, "proxy_pass") or name == "= /metrics":
            continue
        [zone, *_] = one(block, "limit_req")
        assert zone.removeprefix("zone=") in zones, name
        assert zones[zone.removeprefix("zone=")][0] == "$binary_remote_addr"
