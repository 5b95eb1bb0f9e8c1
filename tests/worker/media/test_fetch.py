"""worker/media/fetch.py: an AI bot's media URL is fetched only from an allowed host, and a redirect
is refused rather than followed (a URL the worker fetches must not be turned towards 127.0.0.1:
a blind SSRF). The emulator serves the encrypted media; a small HTTP server of the test answers
with a redirect to it and counts what it is asked."""

from __future__ import annotations

import base64
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.config import Settings
from app.wecom.crypto import WeComCrypto
from emulator import EmulatorConfig, EmulatorServer
from emulator import media as samples
from tests.support.env import make_env, settings_from
from worker.media import errors
from worker.media.fetch import MediaFetcher, allowed_hosts, host_allowed, url_refusal

KEY = base64.b64encode(bytes(range(100, 132))).decode()[:43]
WECOM_MEDIA = "https://ww-aibot-img-1258476243.cos.ap-guangzhou.myqcloud.com/BHoPdA3/cdnimg.png?sign=q"


class Redirector:
    """Answers every GET with ``302 Location: <target>`` and counts the requests."""

    def __init__(self, target: str):
        self.target, self.requests = target, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.requests += 1
                self.send_response(302)
                self.send_header("Location", outer.target)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def emu():
    with EmulatorServer(EmulatorConfig(aibot_token="t", aibot_aes_key=KEY)) as server:
        yield server


def fetcher(hosts: str = "127.0.0.1") -> MediaFetcher:
    settings = settings_from(make_env(), media_url_hosts=hosts, media_max_bytes=64 * 1024)
    services = types.SimpleNamespace(settings=settings, aibot_crypto=WeComCrypto("t", KEY, ""))
    return MediaFetcher(services, wecom=None)


def test_a_url_on_an_allowed_host_is_fetched_and_decrypted(emu):
    fetched = fetcher().from_url(f"{emu.url}/_emulator/aibot/media/emulator-image")
    assert fetched.data == samples.png_image()


def test_a_redirect_is_refused_not_followed(emu):
    """The redirect points at the emulator, on an allowed host: following it would have worked."""
    redirector = Redirector(f"{emu.url}/_emulator/aibot/media/emulator-image")
    try:
        with pytest.raises(errors.MediaFailure) as refused:
            fetcher().from_url(f"{redirector.url}/image")
        assert refused.value.reason == "media url: redirect refused (HTTP 302)"
        assert refused.value.notice == errors.EXPIRED and redirector.requests == 1
    finally:
        redirector.stop()


def test_a_host_not_on_the_list_is_never_asked(emu):
    redirector = Redirector(f"{emu.url}/_emulator/aibot/media/emulator-image")
    try:
        for url in (f"http://localhost:{redirector.server.server_port}/image",  # same server, other name
                    f"http://evil@127.0.0.1:{redirector.server.server_port}/image",  # credentials
                    f"ftp://127.0.0.1:{redirector.server.server_port}/image"):
            with pytest.raises(errors.MediaFailure) as refused:
                fetcher().from_url(url)
            assert refused.value.reason.startswith(("media url: host not on MEDIA_URL_HOSTS",
                                                    "media url: credentials in it",
                                                    "media: no AES key for it, or not an http(s) URL"))
        with pytest.raises(errors.MediaFailure, match="host not on MEDIA_URL_HOSTS"):
            fetcher(hosts="").from_url(f"{emu.url}/_emulator/aibot/media/emulator-image")  # none allowed
        assert redirector.requests == 0
    finally:
        redirector.stop()


def test_wecoms_media_host_is_the_default_and_wildcards_take_subdomains():
    default = allowed_hosts(Settings.model_fields["media_url_hosts"].default)
    assert url_refusal(WECOM_MEDIA, default) is None
    assert url_refusal("https://127.0.0.1/x", default) == "media url: host not on MEDIA_URL_HOSTS"
    assert url_refusal("https://ww-aibot-img-1258476243.cos.ap-guangzhou.myqcloud.com.evil.example/x",
                       default) == "media url: host not on MEDIA_URL_HOSTS"
    hosts = allowed_hosts(" *.Example.com , media.test. ")
    assert hosts == ("*.example.com", "media.test")
    assert host_allowed("a.example.com", hosts) and host_allowed("x.y.EXAMPLE.com", hosts)
    assert host_allowed("media.test", hosts) and not host_allowed("example.com", hosts)
    assert not host_allowed("badexample.com", hosts) and not host_allowed("media.test.evil", hosts)
    assert url_refusal("https://media.test:notaport/x", hosts) == "media url: not a URL"
