"""OpenAI's error shape for the model server's routes (``inference/server/serve.py``,
``inference/server/embeddings.py``): one place for the body, the validation message, and the
HTTP errors Flask raises itself, so a bad request gets a 4xx a client library understands."""

from __future__ import annotations

from flask import Flask, jsonify, request
from pydantic import ValidationError


def error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
          param: str | None = None):
    response = jsonify({"error": {"message": message, "type": kind, "param": param, "code": code}})
    response.status_code = status
    return response


def validation_detail(exc: Exception) -> str:
    """The first few of a pydantic error's problems, "field: message; ..." ("" for others)."""
    errors = exc.errors(include_url=False, include_input=False) if isinstance(exc, ValidationError) else []
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:5])


def register_http_errors(app: Flask, max_body_bytes: int) -> None:
    """A body over ``max_body_bytes`` (413), an unknown route (404), a wrong method (405)."""
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes

    @app.errorhandler(413)
    def _too_large(_exc):
        return error(413, f"the request is over {max_body_bytes} bytes")

    @app.errorhandler(404)
    def _not_found(_exc):
        return error(404, f"no route {request.path}", code="not_found")

    @app.errorhandler(405)
    def _not_allowed(_exc):
        return error(405, f"{request.method} is not allowed on {request.path}")
