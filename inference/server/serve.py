"""`python -m inference serve --model DIR`: an OpenAI-compatible HTTP server over one serving engine.

One process holds the model and its serving engine (`inference.engine.service.EngineService`:
continuous batching, paged KV with prefix caching, MTP speculative decoding); every caller (the
Celery workers, the web tier's `/v1`, anything that speaks OpenAI's API) reaches it over HTTP, so
all their requests share one batch and the weights exist once, as with `vllm serve`:

- `POST /v1/chat/completions`: `messages` (text, or text parts), `max_tokens` /
  `max_completion_tokens`, `temperature`, `top_p`, `stop`, `seed`, `stream` with
  `stream_options.include_usage`, `chat_template_kwargs.enable_thinking`, `guided_choice` (vLLM's:
  the reply is one of these texts, `inference.engine.choices`) with this server's
  `choice_scoring` ("tokens", the default, as vLLM; "likelihood": each text read whole and the
  likeliest one given, `inference.engine.choice_scoring`) and `choice_bias` (one number per
  choice, added to its score); `usage` with
  `prompt_tokens_details.cached_tokens` (prefix-cache hits). A reasoning model's think part is
  sent apart as `reasoning_content` (vLLM's `--reasoning-parser` convention), never in `content`.
  `tools` and `tool_choice` with OpenAI's semantics on GLM-4.5+ models (`inference.reply`): the
  calls come back as `tool_calls` (streamed as OpenAI streams them) with `finish_reason`
  "tool_calls"; assistant turns with `tool_calls` and `tool` turns are checked as OpenAI checks
  them (`inference.tool_calls`) and laid out as the model's template does. `prompt_tokens`
  counts the tools' schemas, which are part of the prompt.
- `POST /v1/embeddings` with `--embeddings DIR` (an `inference.embedder` model: the demo's
  `models/demo-embed`, which the knowledge base's dense retrieval reaches through
  `EMBEDDINGS_BASE_URL`; `inference/server/embeddings.py`).
- `GET /v1/models`, `GET /health` (503 once the engine thread has died), `GET /metrics`
  (Prometheus: requests by outcome, tokens, time to first token, request latency, requests in
  the engine).
- `--api-key` (or `INFERENCE_API_KEY`): every `/v1` call needs `Authorization: Bearer KEY`.

Served by gunicorn in one process (the engine is loaded there, after gunicorn starts it) with a
thread per open request: `--threads` should be at least `--max-num-seqs`, as a streaming
request holds its thread while it waits on the engine. Bad requests get OpenAI's error shape
with a 4xx, never a 500.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from flask import Flask, Response, jsonify, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    ValidationError,
    field_validator,
    model_validator,
)

from inference.embedder import Embedder
from inference.engine import EngineArgs, LLMEngine, PromptTooLongError, RequestFailedError
from inference.engine.service import EngineService
from inference.reply import ReplyReader, ToolUse, tool_use
from inference.sampling_params import SamplingParams
from inference.server import embeddings
from inference.server.errors import error as _error
from inference.server.errors import register_http_errors, validation_detail
from inference.tool_calls import ToolRequestError, check_tool_choice, check_tool_turns, check_tools

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_CHOICES = 64  # guided_choice: replies to choose among


class ChatRequest(BaseModel):
    """The chat completion fields the engine acts on; others are accepted and ignored, as
    OpenAI-compatible servers do."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[dict] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict | None = None
    chat_template_kwargs: dict | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1, max_length=MAX_CHOICES)
    choice_scoring: Literal["tokens", "likelihood"] = "tokens"
    choice_bias: list[FiniteFloat] | None = Field(default=None, max_length=MAX_CHOICES)
    tools: list | None = None  # checked by inference.tool_calls, with OpenAI's messages
    tool_choice: str | dict | None = None

    @field_validator("guided_choice")
    @classmethod
    def _choices(cls, choice: list[str] | None) -> list[str] | None:
        if choice is not None and any(not c.strip() for c in choice):
            raise ValueError("every choice must be a non-empty string")
        return choice

    @model_validator(mode="after")
    def _bias(self) -> ChatRequest:
        if self.choice_bias is not None and (self.choice_scoring != "likelihood"
                                             or len(self.choice_bias) != len(self.guided_choice or ())):
            raise ValueError("choice_bias needs choice_scoring 'likelihood' and one number per guided_choice text")
        return self

    @field_validator("messages")
    @classmethod
    def _texts(cls, messages: list[dict]) -> list[dict]:
        """Each message: a role and text content (a string, or text parts joined), and its tool
        parts (an assistant's ``tool_calls``, a tool result's ``tool_call_id``) as given."""
        out = []
        for i, message in enumerate(messages):
            role, content = message.get("role"), message.get("content")
            if role not in ("system", "user", "assistant", "tool"):
                raise ValueError(f"messages[{i}].role must be system, user, assistant or tool")
            if isinstance(content, list):
                if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                    raise ValueError(f"messages[{i}].content: only text parts are supported")
                content = "".join(str(p.get("text", "")) for p in content)
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
            message = {**{k: message[k] for k in ("tool_calls", "tool_call_id") if k in message},
                       "role": role, "content": content}
            out.append(message)
        return out

    def sampling(self, default_max_tokens: int, tools: ToolUse) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, stop=stop, seed=self.seed,
                              max_tokens=self.max_completion_tokens or self.max_tokens or default_max_tokens,
                              choice=list(self.guided_choice or []), choice_scoring=self.choice_scoring,
                              choice_bias=list(self.choice_bias or []), tool_call=tools.forced)

    @property
    def thinking(self) -> bool:
        return (self.chat_template_kwargs or {}).get("enable_thinking") is not False

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class Metrics:
    def __init__(self, service: EngineService) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("inference_requests", "Chat completion requests by outcome", ["outcome"],
                                registry=self.registry)
        self.prompt_tokens = Counter("inference_prompt_tokens", "Prompt tokens", registry=self.registry)
        self.cached_tokens = Counter("inference_cached_prompt_tokens", "Prompt tokens served from the prefix cache",
                                     registry=self.registry)
        self.generation_tokens = Counter("inference_generation_tokens", "Generated tokens", registry=self.registry)
        self.first_token = Histogram("inference_time_to_first_token_seconds", "Time to the first token",
                                     registry=self.registry,
                                     buckets=(0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30))
        self.latency = Histogram("inference_request_seconds", "Request latency, to the last token",
                                 registry=self.registry, buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120))
        in_engine = Gauge("inference_requests_in_engine", "Requests queued or running in the engine",
                          registry=self.registry)
        in_engine.set_function(lambda: len(service.engine.requests))

    def finished(self, outcome: str, output=None, started: float | None = None) -> None:
        self.requests.labels(outcome).inc()
        if output is not None:
            self.prompt_tokens.inc(output.prompt_tokens)
            self.cached_tokens.inc(output.cached_tokens)
            self.generation_tokens.inc(output.completion_tokens)
        if started is not None:
            self.latency.observe(time.perf_counter() - started)


def create_app(service: EngineService, model_name: str, api_key: str = "", default_max_tokens: int = 1024,
               embedder=None, embedder_name: str = "") -> Flask:
    app = Flask(__name__)
    if embedder is not None:
        embeddings.register(app, embedder, embedder_name)
    register_http_errors(app, MAX_BODY_BYTES)
    metrics = Metrics(service)
    tokenizer = service.engine.tokenizer

    @app.before_request
    def _authorize():
        if not api_key or not request.path.startswith("/v1/"):
            return None
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), api_key.encode()):
            return _error(401, "a valid API key is required (Authorization: Bearer KEY)",
                          "authentication_error", "invalid_api_key")
        return None

    @app.get("/health")
    def health():
        if not service.alive():
            return _error(503, "the engine thread has stopped", "server_error")
        return jsonify({"status": "ok", "model": model_name})

    @app.get("/metrics")
    def metrics_view():
        return Response(generate_latest(metrics.registry), mimetype=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    def models():
        names = [model_name, *([embedder_name] if embedder is not None else [])]
        return jsonify({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "wecom-bot"} for name in names]})

    @app.post("/v1/chat/completions")
    def chat_completions():
        try:
            body = json.loads(request.get_data(cache=False) or b"null")
        except (ValueError, RecursionError):
            return _error(400, "the body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        try:
            chat = ChatRequest.model_validate(body)
        except (ValidationError, RecursionError) as exc:
            return _error(400, validation_detail(exc) or "the request is not valid")
        if chat.model not in (None, model_name):
            return _error(404, f"the model {chat.model!r} does not exist here (it serves {model_name!r})",
                          code="model_not_found")
        if chat.guided_choice and tokenizer.thinking:
            return _error(400, "guided_choice: this model writes a think part first; choices need one that does not")
        try:
            tools = check_tools(chat.tools)
            choice = check_tool_choice(chat.tool_choice, tools)
            messages = check_tool_turns(chat.messages)
            use = tool_use(tokenizer, tools, choice, chat.thinking)
            prompt = tokenizer.apply_chat_template(messages, enable_thinking=chat.thinking, tools=use.shown)
            params = chat.sampling(default_max_tokens, use)
        except ToolRequestError as exc:
            return _error(400, str(exc), param=exc.param)
        except ValueError as exc:
            return _error(400, str(exc))
        completion = Completion(service, metrics, tokenizer, model_name, chat, prompt, params,
                                ReplyReader(tokenizer, chat.thinking, use.read))
        if chat.stream:
            return Response(completion.events(), mimetype="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return completion.whole()

    return app


class Completion:
    """One chat completion: the engine's outputs turned into OpenAI's answer or its stream."""

    def __init__(self, service: EngineService, metrics: Metrics, tokenizer, model_name: str, chat: ChatRequest,
                 prompt, params: SamplingParams, reader: ReplyReader) -> None:
        self.service, self.metrics, self.model_name, self.chat = service, metrics, model_name, chat
        self.prompt, self.params, self.reader = prompt, params, reader
        self.id, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self.started = time.perf_counter()

    def _outputs(self) -> Iterator:
        """The engine's outputs; the first one's arrival is the time to the first token."""
        first = True
        for output in self.service.submit(self.prompt, self.params):
            if first and output.new_token_ids:
                self.metrics.first_token.observe(time.perf_counter() - self.started)
                first = False
            yield output

    def _usage(self, output) -> dict:
        return {"prompt_tokens": output.prompt_tokens, "completion_tokens": output.completion_tokens,
                "total_tokens": output.prompt_tokens + output.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": output.cached_tokens}}

    def _failure(self, exc: Exception):
        if isinstance(exc, PromptTooLongError):
            self.metrics.finished("too_long")
            return 400, str(exc), "invalid_request_error", "context_length_exceeded"
        if isinstance(exc, RequestFailedError):
            self.metrics.finished("failed")
            return 503, f"the engine failed this request: {exc}", "server_error", None
        self.metrics.finished("refused")
        return 400, f"the engine refused the request: {exc}", "invalid_request_error", None

    def whole(self):
        output = None
        try:
            for output in self._outputs():  # noqa: B007 - the last one is the answer
                pass
        except (PromptTooLongError, RequestFailedError, ValueError) as exc:
            return _error(*self._failure(exc))
        reader = self.reader
        reader.feed(output.text)
        reader.finish()
        calls = [call.as_openai() for call in reader.tool_calls]
        message = {"role": "assistant", "content": reader.content or (None if calls else "")}
        if reader.reasoning:
            message["reasoning_content"] = reader.reasoning
        if calls:
            message["tool_calls"] = calls
        self.metrics.finished("ok", output, self.started)
        return jsonify({"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model_name,
                        "choices": [{"index": 0, "message": message,
                                     "finish_reason": reader.finish_reason(output.finish_reason)}],
                        "usage": self._usage(output)})

    def _chunk(self, delta: dict, finish: str | None = None) -> str:
        return "data: " + json.dumps({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                      "model": self.model_name,
                                      "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]},
                                     ensure_ascii=False) + "\n\n"

    def _deltas(self, piece) -> Iterator[str]:
        """A piece of the reply as chunks: its text, then each piece of a call in a chunk of its own."""
        delta = {}
        if piece.reasoning:
            delta["reasoning_content"] = piece.reasoning
        if piece.content:
            delta["content"] = piece.content
        if delta:
            yield self._chunk(delta)
        for call in piece.tool_calls:
            yield self._chunk({"tool_calls": [call.as_openai()]})

    def events(self) -> Iterator[str]:
        """Server-sent events; a client that goes away aborts the request in the engine (the
        generator is closed, and so is the engine's stream)."""
        output, finished = None, False
        yield self._chunk({"role": "assistant", "content": ""})
        try:
            for output in self._outputs():
                if output.delta:
                    yield from self._deltas(self.reader.feed(output.delta))
            finished = True
        except (PromptTooLongError, RequestFailedError, ValueError) as exc:
            status, message, kind, code = self._failure(exc)
            yield "data: " + json.dumps({"error": {"message": message, "type": kind, "code": code,
                                                   "status": status}}) + "\n\n"
            yield "data: [DONE]\n\n"
            return
        finally:
            if not finished and output is not None and not output.finished:
                self.metrics.finished("abandoned")
        yield from self._deltas(self.reader.finish())
        yield self._chunk({}, self.reader.finish_reason(output.finish_reason))
        if self.chat.include_usage:
            yield "data: " + json.dumps({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                         "model": self.model_name, "choices": [],
                                         "usage": self._usage(output)}) + "\n\n"
        self.metrics.finished("ok", output, self.started)
        yield "data: [DONE]\n\n"


def load_app(args) -> Flask:
    """The engine from the command line's settings, and the app over it (in the serving process)."""
    path = Path(args.model)
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(path), max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
        kv_cache_bytes=args.kv_cache_bytes, speculative_k=args.speculative_k, dtype=args.dtype,
        device=args.device, gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager))
    if engine.tokenizer is None:
        raise SystemExit(f"{path} has no tokenizer: the server answers chat completions")
    name = args.served_model_name or path.name
    log.info("serving %s from %s on %s (max_num_seqs %d)", name, path, engine.model.device, args.max_num_seqs)
    embedder, embedder_name = None, ""
    if args.embeddings:
        embedder, embedder_name = Embedder.load(args.embeddings), Path(args.embeddings).name
        log.info("serving embeddings %s from %s", embedder_name, args.embeddings)
    return create_app(EngineService(engine), name, args.api_key or os.environ.get("INFERENCE_API_KEY", ""),
                      args.default_max_tokens, embedder, embedder_name)


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--embeddings", default=None,
                        help="also serve /v1/embeddings with this embedder directory (inference/embedder.py)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None, help="the name /v1/models lists (default: the directory's)")
    parser.add_argument("--api-key", default=None, help="require this bearer key (default: INFERENCE_API_KEY, or none)")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--kv-cache-bytes", type=int, default=None, help="the paged KV cache (default: the engine's)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--speculative-k", type=int, default=0, help="MTP drafts a step (0: plain decoding)")
    parser.add_argument("--default-max-tokens", type=int, default=1024, help="when a request gives none")
    parser.add_argument("--threads", type=int, default=None, help="request threads (default: max-num-seqs + 8)")
    parser.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: the checkpoint's; fp32 serves in bf16 on CUDA)")
    parser.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="never replay decode steps from CUDA graphs (captured by default on CUDA)")


def serve(args) -> int:
    """Run the server in the foreground until SIGTERM/SIGINT."""
    from gunicorn.app.base import BaseApplication

    class Server(BaseApplication):
        def load_config(self):
            self.cfg.set("bind", f"{args.host}:{args.port}")
            self.cfg.set("workers", 1)  # one engine: one process
            self.cfg.set("worker_class", "gthread")
            self.cfg.set("threads", args.threads or args.max_num_seqs + 8)
            self.cfg.set("timeout", 0)  # a long generation is not a hung worker
            self.cfg.set("graceful_timeout", 30)
            self.cfg.set("keepalive", 75)
            self.cfg.set("accesslog", None)  # the metrics count requests; message content stays out of logs

        def load(self):
            return load_app(args)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Server().run()
    return 0
