"""The one small interface the worker (and the API gateway) calls to run a model.

Two backends behind ``INFERENCE_BACKEND``: ``engine`` (the bundled engine in ``inference/``, one
per process) and ``openai`` (any OpenAI-compatible server: vLLM, SGLang or a hosted API).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import requests

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 0.9
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class Generation:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finish_reason: str = "stop"
    latency_s: float = 0.0


@dataclass
class StreamDelta:
    """One piece of a streamed answer; the last one carries ``final``."""

    text: str
    final: Generation | None = field(default=None)


class LLMError(RuntimeError):
    """The model could not answer. ``transient`` errors are worth a retry."""

    def __init__(self, message: str, *, transient: bool = True, status: int = 503):
        super().__init__(message)
        self.transient = transient
        self.status = status


class LLMBackend(Protocol):
    model_name: str

    def generate(self, messages: list[dict], params: GenerationParams) -> Generation: ...

    def stream(self, messages: list[dict], params: GenerationParams) -> Iterator[StreamDelta]: ...


class OpenAIBackend:
    """Chat completions over HTTP, with timeouts and bounded retries on connection errors/5xx."""

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 120.0,
                 retries: int = 2, session: requests.Session | None = None):
        self.base_url = base_url.rstrip("/")
        self.model_name = model
        self.timeout = (3.05, timeout_s)
        self.retries = retries
        self.session = session or requests.Session()
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def _body(self, messages: list[dict], params: GenerationParams, stream: bool) -> dict:
        body = {"model": self.model_name, "messages": messages, "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "stream": stream}
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _post(self, body: dict, stream: bool) -> requests.Response:
        url = f"{self.base_url}/chat/completions"
        for attempt in range(self.retries + 1):
            try:
                resp = self.session.post(url, json=body, headers=self.headers,
                                         timeout=self.timeout, stream=stream)
            except (requests.ConnectionError, requests.Timeout) as exc:
                if attempt == self.retries:
                    raise LLMError(f"model server unreachable: {type(exc).__name__}") from exc
            else:
                if resp.status_code < 500 and resp.status_code != 429:
                    break
                if attempt == self.retries:
                    raise LLMError(f"model server answered {resp.status_code}")
                resp.close()
            time.sleep(min(0.5 * 2**attempt, 4.0))
        if resp.status_code != 200:
            raise LLMError(f"model server refused the request ({resp.status_code})", transient=False,
                           status=resp.status_code)
        return resp

    def generate(self, messages: list[dict], params: GenerationParams) -> Generation:
        started = time.perf_counter()
        resp = self._post(self._body(messages, params, stream=False), stream=False)
        try:
            data = resp.json()
            choice = data["choices"][0]
            usage = data.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            return Generation(
                text=choice["message"]["content"] or "",
                model=data.get("model", self.model_name),
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
                cached_tokens=int(details.get("cached_tokens") or 0),
                finish_reason=choice.get("finish_reason") or "stop",
                latency_s=time.perf_counter() - started,
            )
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LLMError("model server sent a malformed answer") from exc

    def stream(self, messages: list[dict], params: GenerationParams) -> Iterator[StreamDelta]:
        started = time.perf_counter()
        resp = self._post(self._body(messages, params, stream=True), stream=True)
        parts: list[str] = []
        usage: dict = {}
        finish = "stop"
        model = self.model_name
        with resp:
            for line in resp.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                try:
                    chunk = json.loads(payload)
                except ValueError as exc:
                    raise LLMError("model server sent a malformed stream") from exc
                model = chunk.get("model", model)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") or ""
                    finish = choice.get("finish_reason") or finish
                    if text:
                        parts.append(text)
                        yield StreamDelta(text)
        details = usage.get("prompt_tokens_details") or {}
        yield StreamDelta("", Generation(
            text="".join(parts), model=model, prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            cached_tokens=int(details.get("cached_tokens") or 0), finish_reason=finish,
            latency_s=time.perf_counter() - started))


def make_backend(settings) -> LLMBackend:
    """The backend the settings ask for (the engine is loaded here, once per process)."""
    if settings.inference_backend == "openai":
        return OpenAIBackend(settings.openai_base_url, settings.openai_model,
                             settings.openai_api_key.get_secret_value(), settings.openai_timeout_s)
    from worker.engine_backend import EngineBackend

    return EngineBackend.from_settings(settings)
