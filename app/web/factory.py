"""The Flask service: WeCom callback URL, the OpenAI-compatible ``/v1`` API and the admin area.

``create_app()`` is the factory gunicorn runs (``app.web.factory:create_app()``); it reads the settings from
the environment, so a missing or malformed secret stops start-up with a message naming it.
``WEB_ROLE`` picks the routes: ``all``, or ``web`` (callbacks, admin, probes) and ``api`` (``/v1``)
for two gunicorns, so that streams of a slow model never hold the callbacks' threads.
"""

from __future__ import annotations

import logging

from flask import Flask, g, jsonify, request
from sqlalchemy import exc as sa_exc
from werkzeug.exceptions import HTTPException
from werkzeug.routing import IntegerConverter

from app import logging_setup, redis_client
from app.config import Settings, get_settings
from app.db import MAX_ROW_ID
from app.services import Services

log = logging.getLogger(__name__)


class RowIdConverter(IntegerConverter):
    """``<int:...>`` bounded to what a 64-bit id column holds: a longer number is a 404, not an
    overflow in the database driver (a 500)."""

    def __init__(self, map, fixed_digits=0, min=None, max=MAX_ROW_ID, signed=False):  # noqa: A002
        super().__init__(map, fixed_digits, min, max, signed)


def body_limits(settings: Settings):
    """The largest body each path takes: a document upload, a /v1 conversation, else a callback
    (the app's MAX_CONTENT_LENGTH; the admin forms are far smaller)."""
    from app.web.admin.knowledge import MULTIPART_SLACK

    def limit_for(path: str) -> int:
        if path == "/admin/knowledge/upload":
            return settings.kb_max_upload_bytes + MULTIPART_SLACK
        if path.startswith("/v1/"):
            return settings.api_max_body_bytes
        return settings.callback_max_bytes

    return limit_for


def create_app(settings: Settings | None = None, services: Services | None = None) -> Flask:
    settings = settings or (services.settings if services else get_settings())
    services = services or Services(settings)
    # a Redis Cluster as Celery's broker (or a malformed REDIS_URL) stops the start, not a task
    redis_client.check_settings(settings)

    logging_setup.configure(settings)
    app = Flask(__name__)
    app.url_map.converters["int"] = RowIdConverter  # before any route is added
    app.config.update(
        SECRET_KEY=settings.secret_key.get_secret_value(),
        # Werkzeug refuses larger bodies itself, chunked ones included.
        MAX_CONTENT_LENGTH=settings.callback_max_bytes,
        JSON_AS_ASCII=False,
    )
    app.extensions["services"] = services
    from app.web import aibot_callback, api, callback, health, metrics_view
    from app.web.body_reader import BodyFirst, raise_body_error
    from app.web.proxy import trust_proxies

    # Every body is in (or refused: 408, 413) before any hook or view reads it, CSRF included.
    app.wsgi_app = BodyFirst(app.wsgi_app, settings.request_body_timeout_s, body_limits(settings))
    app.before_request(raise_body_error)  # the first hook

    trust_proxies(app, settings.trusted_proxies)
    app.register_blueprint(health.bp)
    if settings.web_role != "api":  # WEB_ROLE: the callbacks' service serves them
        app.register_blueprint(callback.bp)
        app.register_blueprint(aibot_callback.bp)
    if settings.web_role != "web":  # ... and /v1 has a service of its own (docs/deploy.md)
        app.register_blueprint(api.bp)
    app.register_blueprint(metrics_view.bp)
    app.extensions["metrics_registry"] = metrics_view.scrape_registry(services)

    if settings.web_role != "api":
        from app.web import admin

        admin.init_app(app, services)

    from app.cli import apikeys, audit, budgets, keys, prices, users

    for group in (apikeys, audit, budgets, keys, prices, users):
        app.cli.add_command(group)

    @app.before_request
    def _request_id():
        g.request_id = (logging_setup.clean_request_id(request.headers.get("X-Request-Id"))
                        or logging_setup.new_request_id())
        g.request_id_token = logging_setup.request_id_var.set(g.request_id)

    @app.teardown_request
    def _forget_request_id(_exc):
        token = g.pop("request_id_token", None)
        if token is not None:
            try:
                logging_setup.request_id_var.reset(token)
            except ValueError:  # torn down in another context (a streamed response)
                logging_setup.request_id_var.set(None)

    @app.after_request
    def _echo_request_id(response):
        response.headers["X-Request-Id"] = g.get("request_id", "")
        return response

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        if request.path.startswith("/v1/"):  # unknown API routes and methods, in OpenAI's shape
            if settings.web_role == "web" and exc.code == 404:
                exc.description = "/v1 is served by the API service (WEB_ROLE=api), not this one"
            return api.http_error(exc)
        return jsonify(error=exc.description if exc.code != 413 else "body too large"), exc.code

    @app.errorhandler(sa_exc.OperationalError)
    @app.errorhandler(sa_exc.InterfaceError)
    @app.errorhandler(sa_exc.TimeoutError)
    def _storage_unavailable(exc: Exception):
        # The database is down or unreachable: a condition to retry, not a bug (500). The /v1
        # blueprint answers these itself, in OpenAI's shape.
        log.warning("storage unavailable (%s) request_id=%s", type(exc).__name__, g.get("request_id"))
        return jsonify(error="storage unavailable, retry later"), 503, {"Retry-After": "5"}

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error request_id=%s", g.get("request_id"))
        return jsonify(error="internal error"), 500

    return app
