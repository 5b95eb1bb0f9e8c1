"""Building the emulator's Flask app, and serving it on a background thread for tests."""

from __future__ import annotations

import logging
from pathlib import Path

from flask import Flask

from emulator import admin, api, kf, login, media
from emulator.aibot import AibotDeliverer
from emulator.aibot_ws import LongConnection
from emulator.callbacks import CallbackDeliverer
from emulator.config import EmulatorConfig, UnsafeToRun, loopback
from emulator.http_server import WSGIServer, access_logged
from emulator.state import EmulatorState

_HERE = Path(__file__).parent


def serve(app: Flask, host: str, port: int) -> WSGIServer:
    """A keep-alive WSGI server for ``app`` (not yet serving), with an access log that leaves
    out query strings; port 0 picks a free one. Loopback addresses only
    (``config.refuse_production``)."""
    if not loopback(host):
        raise UnsafeToRun(f"the emulator binds to loopback only, not {host!r}")
    return WSGIServer(access_logged(app, logging.getLogger("emulator.access")), host, port,
                      name="wecom-emulator")


def create_emulator(config: EmulatorConfig | None = None) -> tuple[Flask, EmulatorState]:
    """A fresh emulator: its Flask app and the state behind it (shared by all its threads)."""
    config = config or EmulatorConfig.from_env()
    state = EmulatorState(config)
    app = Flask("emulator", template_folder=str(_HERE / "templates"),
                static_folder=str(_HERE / "static"), static_url_path="/_emulator/static")
    app.json.ensure_ascii = False  # WeCom answers UTF-8, not \\u escapes
    app.json.sort_keys = False
    app.extensions["wecom_emulator"] = state
    app.extensions["wecom_emulator_deliverer"] = CallbackDeliverer(state)
    app.extensions["wecom_emulator_aibot"] = AibotDeliverer(state)
    app.extensions["wecom_emulator_aibot_ws"] = LongConnection(state, app.extensions["wecom_emulator_aibot"])
    app.register_blueprint(api.bp)
    app.register_blueprint(admin.bp)
    app.extensions["wecom_emulator_media"] = media.MediaStore()
    app.register_blueprint(media.bp)
    app.extensions["wecom_emulator_kf"] = kf.KfState(state.wall)  # 微信客服
    app.register_blueprint(kf.bp)
    app.extensions["wecom_emulator_login"] = login.LoginCodes(state.clock)
    app.register_blueprint(login.bp)
    return app, state


class EmulatorServer:
    """The emulator on a thread of this process; ``url`` is known once ``start()`` returns.

        with EmulatorServer(EmulatorConfig(callback_url=..., retry_interval=0.1)) as emu:
            requests.get(emu.url + "/cgi-bin/gettoken", ...)
            emu.state.messages ...
    """

    def __init__(self, config: EmulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.app, self.state = create_emulator(config)
        self.host, self.port = host, port
        self._server: WSGIServer | None = None

    @property
    def deliverer(self) -> CallbackDeliverer:
        return self.app.extensions["wecom_emulator_deliverer"]

    @property
    def long_connection(self) -> LongConnection:
        return self.app.extensions["wecom_emulator_aibot_ws"]

    @property
    def ws_url(self) -> str:
        """The AI bot's long connection (when the bot id and secret are configured)."""
        return f"ws://{self.host}:{self.long_connection.port}"

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("emulator not started")
        return f"http://{self.host}:{self._server.port}"

    def start(self) -> str:
        self._server = serve(self.app, self.host, self.port).start()
        if self.long_connection.enabled:
            self.long_connection.start()
        logging.getLogger("emulator").info("emulator listening on %s", self.url)
        return self.url

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, wake sleeping faults and retry waits, and join the callback threads."""
        self.state.stopping.set()
        if self._server is not None:
            self._server.stop(timeout)
        self.deliverer.join(timeout)
        self.app.extensions["wecom_emulator_aibot"].join(timeout)
        self.long_connection.stop(timeout)

    def __enter__(self) -> EmulatorServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_in_thread(config: EmulatorConfig | None = None, host: str = "127.0.0.1",
                  port: int = 0) -> EmulatorServer:
    """Start an emulator on a free port and return it (call ``.stop()`` when done)."""
    server = EmulatorServer(config, host, port)
    server.start()
    return server
