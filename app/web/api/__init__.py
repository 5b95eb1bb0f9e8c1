"""OpenAI-compatible API for internal applications: ``POST /v1/chat/completions`` (plain and
SSE streaming) and ``GET /v1/models``, behind per-application API keys.

A request goes: key (401) -> rate limit per key (429, ``app.web.api.ratelimit``) -> requests in
flight per key (429, ``app.web.api.concurrency``; the slot is held until the answer, streamed or
not, is done) -> body and parameters (400, ``app.web.api.validation``) -> model name (404) -> budget reservation (429) ->
the model (503 when it is down or overloaded) -> usage and audit (``app.web.api.gateway``). Every
error has OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``, so the official
clients raise their usual exceptions; bad input is never a 500.

Rate-limited requests are refused before anything is written (no audit row): shedding load must
stay cheap. Unauthenticated requests are logged, not audited, for the same reason.

A reasoning model's think part is never part of ``content``: with ``API_REASONING=separate`` it
comes beside it as ``reasoning_content`` (``delta.reasoning_content`` in a stream, as vLLM and
hosted GLM APIs send it), with ``strip`` it is dropped. ``chat_template_kwargs.enable_thinking``
reaches the model (the bundled engine's chat layout, or the model server's).

``tools`` and ``tool_choice`` reach the model too (``app/llm/tools.py``); its calls come back as
``message.tool_calls`` (``content`` null when it wrote no text) and, streamed, as
``delta.tool_calls`` pieces, with ``finish_reason`` "tool_calls". The tools count in the prompt's
tokens: the budget reservation estimates them, the usage is the model's count.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from flask import Blueprint, Response, current_app, g, jsonify, request
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import HTTPException

from app import json_input
from app.accounting import estimate_completion_tokens, estimate_prompt_tokens
from app.audit.chain import request_fingerprint
from app.llm import Generation, GenerationParams, LLMError
from app.web.api import concurrency, ratelimit
from app.web.api.errors import ApiError, from_llm_error, invalid
from app.web.api.gateway import Gateway
from app.web.api.keys import Caller, authenticate
from app.web.api.validation import ChatRequest, parse_chat_request
from app.web.body_reader import read_body

log = logging.getLogger(__name__)
bp = Blueprint("api", __name__, url_prefix="/v1")


def gateway() -> Gateway:
    ext = current_app.extensions
    if "api_gateway" not in ext:
        ext["api_gateway"] = Gateway(ext["services"])
    return ext["api_gateway"]


def slots() -> concurrency.Holder:
    ext = current_app.extensions
    if "api_slots" not in ext:
        ext["api_slots"] = concurrency.Holder(ext["services"].redis)
    return ext["api_slots"]


@bp.before_request
def _body_limit():
    # Conversations are larger than WeCom callbacks (the app-wide MAX_CONTENT_LENGTH).
    request.max_content_length = current_app.extensions["services"].settings.api_max_body_bytes


@bp.errorhandler(ApiError)
def _api_error(exc: ApiError):
    return exc.response()


@bp.errorhandler(HTTPException)
def http_error(exc: HTTPException):
    message = "the body is too large" if exc.code == 413 else exc.description
    return ApiError(exc.code or 400, message, code="invalid_request").response()


@bp.errorhandler(SQLAlchemyError)
def _storage_down(exc: SQLAlchemyError):
    # The key check and the budget need the database: without it, refuse honestly and briefly.
    log.error("api: database unavailable request_id=%s: %s", g.get("request_id"),
              type(exc).__name__)
    return ApiError(503, "the service's storage is unavailable; retry later",
                    code="storage_unavailable", retry_after=5).response()


@bp.errorhandler(Exception)
def _unexpected(exc: Exception):
    log.exception("unhandled API error request_id=%s", g.get("request_id"))
    return ApiError(500, "internal error", code="internal_error").response()


def _caller() -> Caller:
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    services = current_app.extensions["services"]
    caller = None
    if scheme.lower() == "bearer":
        caller = authenticate(services.db, services.blind_index, key.strip(),
                              cipher=services.cipher)
    if caller is None:
        log.info("api: refused key request_id=%s", g.get("request_id"))
        raise ApiError(401, "invalid or missing API key (Authorization: Bearer sk-...)",
                       code="invalid_api_key")
    return caller


def _fingerprint() -> str:
    secret = current_app.extensions["services"].settings.secret_key.get_secret_value()
    return request_fingerprint(secret, request.remote_addr, request.headers.get("User-Agent"))


@bp.get("/models")
def models():
    _caller()
    return jsonify(object="list", data=[{"id": gateway().model_name, "object": "model",
                                         "created": 0, "owned_by": "wecom-bot"}])


@bp.post("/chat/completions")
def chat_completions():
    caller = _caller()
    services = current_app.extensions["services"]
    verdict = ratelimit.check(services.redis, caller.id, caller.rate_limit_per_min)
    if not verdict.allowed:
        raise ApiError(429, f"rate limit of {caller.rate_limit_per_min} requests per minute "
                       "reached", code="rate_limit_exceeded", retry_after=verdict.retry_after_s)
    limit = services.settings.api_max_concurrent_per_key
    slot = concurrency.acquire(slots(), caller.id, limit)
    if not isinstance(slot, concurrency.Slot):
        raise ApiError(429, f"{limit} requests of this API key are in flight already "
                       "(API_MAX_CONCURRENT_PER_KEY); retry when one has finished",
                       code="concurrency_limit_exceeded", retry_after=max(1, min(int(slot) + 1, 30)))
    try:
        response = _completion_of(services, caller, slot)
    except BaseException:
        slot.release()
        raise
    if response.is_streamed:  # held until the stream ends (its generator) or is closed unread
        response.call_on_close(slot.release)
    else:
        slot.release()
    return response


def _completion_of(services, caller: Caller, slot: concurrency.Slot) -> Response:
    gw = gateway()
    audit = {"request_id": g.get("request_id"), "fingerprint": _fingerprint()}
    try:
        chat = _chat_request(services.settings, gw.model_name)
    except ApiError as exc:
        gw.audit(caller, f"error_{exc.status}", error=exc.message, **audit)
        raise
    try:
        admission = gw.admit(caller, chat)
    except ApiError as exc:
        gw.audit(caller, "budget_block", chat=chat, error=exc.message, **audit)
        raise
    try:
        if chat.stream:
            return _stream(gw, caller, chat, admission, audit, slot)
        generation = gw.backend.generate(chat.messages, chat.params)
    except LLMError as exc:
        gw.release(admission)
        gw.audit(caller, "model_error", chat=chat, error=str(exc), **audit)
        raise from_llm_error(exc) from None
    except BaseException:
        gw.release(admission)
        raise
    gw.settle(admission, caller, generation)
    gw.audit(caller, "ok", chat=chat, answer=generation.text, generation=generation, **audit)
    return jsonify(_completion(chat, generation, _show_reasoning(services.settings)))


def _show_reasoning(settings) -> bool:
    return settings.api_reasoning == "separate"


def _chat_request(settings, model_name: str) -> ChatRequest:
    try:
        body = json_input.loads(read_body())
    except json_input.JsonTooDeep as exc:
        raise invalid(str(exc)) from None
    except ValueError:
        raise invalid("the body is not valid JSON") from None
    chat = parse_chat_request(body, min(settings.max_new_tokens, settings.api_max_tokens),
                              settings.api_max_tokens,
                              GenerationParams(temperature=settings.temperature,
                                               top_p=settings.top_p))
    if chat.model != model_name:
        raise ApiError(404, f"the model {chat.model!r} does not exist; GET /v1/models lists "
                       "the one served", code="model_not_found", param="model")
    return chat


def _usage(generation: Generation) -> dict:
    return {"prompt_tokens": generation.prompt_tokens,
            "completion_tokens": generation.completion_tokens,
            "total_tokens": generation.prompt_tokens + generation.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": generation.cached_tokens}}


def _completion_id() -> str:
    return f"chatcmpl-{g.get('request_id') or uuid.uuid4().hex}"


def _completion(chat: ChatRequest, generation: Generation, show_reasoning: bool) -> dict:
    calls = [call.as_openai() for call in generation.tool_calls]
    message = {"role": "assistant", "content": generation.text or (None if calls else "")}
    if show_reasoning and generation.reasoning:
        message["reasoning_content"] = generation.reasoning
    if calls:
        message["tool_calls"] = calls
    return {"id": _completion_id(), "object": "chat.completion", "created": int(time.time()),
            "model": chat.model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": generation.finish_reason}],
            "usage": _usage(generation)}


def _sse(data: dict | str) -> str:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n"


def _stream(gw: Gateway, caller: Caller, chat: ChatRequest, admission, audit: dict,
            slot: concurrency.Slot) -> Response:
    show_reasoning = _show_reasoning(gw.settings)
    deltas = gw.backend.stream(chat.messages, chat.params)
    # Wait for the first piece here: a model server that is down is then still a 503 with a
    # status line, not an error event inside a 200 stream.
    first = next(deltas, None)
    if first is None:
        raise LLMError("the model ended the stream before answering")
    base = {"id": _completion_id(), "object": "chat.completion.chunk", "created": int(time.time()),
            "model": chat.model, "system_fingerprint": None}

    def chunk(delta: dict, finish: str | None = None) -> str:
        body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": finish}]}
        if chat.include_usage:
            body["usage"] = None
        return _sse(body)

    def events():
        parts: list[str] = []
        thoughts: list[str] = []
        called: list[str] = []  # the calls' names and argument pieces: written, so charged
        final: Generation | None = None
        done = False

        def finish(outcome: str, error: str | None = None) -> None:
            nonlocal done
            done = True
            text, reasoning = "".join(parts), "".join(thoughts)
            generation = final
            if generation is None and (parts or thoughts or called):
                # Cut short (client gone, model failed): charge what was produced, thinking
                # included, estimated as the reservation does, so hanging up is never a way
                # around the budget.
                generation = Generation(text=text, model=gw.model_name,
                                        prompt_tokens=estimate_prompt_tokens(chat.messages, chat.tools),
                                        completion_tokens=estimate_completion_tokens(
                                            text + "".join(called), reasoning),
                                        finish_reason="abort", reasoning=reasoning)
            if generation is not None:
                gw.settle(admission, caller, generation)
            else:
                gw.release(admission)
            gw.audit(caller, outcome, chat=chat, answer=text, generation=generation, error=error,
                     **audit)

        try:
            yield chunk({"role": "assistant", "content": ""})
            piece = first
            while piece is not None:
                final = piece.final or final
                if piece.reasoning:
                    thoughts.append(piece.reasoning)
                    if show_reasoning:
                        yield chunk({"reasoning_content": piece.reasoning})
                if piece.text:
                    parts.append(piece.text)
                    yield chunk({"content": piece.text})
                for call in piece.tool_calls:
                    called.append((call.name or "") + call.arguments)
                    yield chunk({"tool_calls": [call.as_openai()]})
                piece = next(deltas, None)
            # Recorded before the last events: a client that has read [DONE] finds its usage.
            finish("ok")
            yield chunk({}, final.finish_reason if final else "stop")
            if chat.include_usage and final is not None:
                yield _sse({**base, "choices": [], "usage": _usage(final)})
            yield _sse("[DONE]")
        except LLMError as exc:
            finish("model_error", str(exc))
            yield _sse(from_llm_error(exc).body())
        finally:
            if not done:
                finish("disconnected")
            slot.release()

    return Response(events(), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
