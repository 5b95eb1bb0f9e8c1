"""Errors in OpenAI's JSON shape, so the official clients raise their usual exceptions."""

from __future__ import annotations

from flask import jsonify

from app.llm import LLMError

# status -> OpenAI's error ``type``
TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
         405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
         503: "service_unavailable"}
MODEL_RETRY_AFTER_S = 5


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None, retry_after: int | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.type = type or TYPES.get(status, "api_error")
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}

    def response(self):
        response = jsonify(self.body())
        response.status_code = self.status
        if self.retry_after is not None:
            response.headers["Retry-After"] = str(self.retry_after)
        if self.status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="api"'
        return response


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code="invalid_value" if param else "invalid_request", param=param)


def from_llm_error(exc: LLMError) -> ApiError:
    """The model's refusal of *this* request is the caller's (400); anything else is ours (503).

    The engine raises 400 for a prompt over ``max_model_len``; the engine's out-of-memory or a
    model server that is down or answering 5xx (after the backend's own retries) is 503.
    """
    if exc.status in (400, 413, 422):
        return ApiError(400, str(exc), code="context_length_exceeded" if exc.status != 422
                        else "invalid_request")
    return ApiError(503, "the model is unavailable or overloaded; retry later",
                    code="model_unavailable", retry_after=MODEL_RETRY_AFTER_S)
