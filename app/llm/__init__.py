"""The one small interface the worker (and the API gateway) calls to run a model.

Two backends behind ``INFERENCE_BACKEND``: ``engine`` (the bundled engine in ``inference/``, one
per process) and ``openai`` (any OpenAI-compatible server: vLLM, SGLang or a hosted API).

A reasoning model (GLM-4.5 and later) thinks before it answers. Both backends hand back the two
apart: ``text`` is the answer alone, ``reasoning`` the think part; callers choose what to show
(the worker never shows the reasoning to an employee; the /v1 API per ``API_REASONING``).
Token counts cover everything the model generated, thinking included.

Function calling: ``GenerationParams.tools`` and ``tool_choice`` go to the model, the calls come
back in ``Generation.tool_calls`` (``StreamDelta.tool_calls`` as they stream); the
representation is in ``app/llm/tools.py``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import urllib3

from app.http.pool import HttpError, HttpPool, iter_lines
from app.llm.tools import ToolCall, ToolCallDelta, ToolChoice, ToolSpec
from inference.reasoning import ReasoningSplitter

log = logging.getLogger(__name__)
REPLY_STARTS = ("auto", "answer", "thinking")


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 0.9
    stop: tuple[str, ...] = ()
    seed: int | None = None
    enable_thinking: bool | None = None  # None: the model's default (a reasoning model thinks)
    # The reply must be one of these (an extractive model quoting a passage: KB_ANSWER_BY_QUOTING);
    # the bundled engine's SamplingParams.choice, vLLM's and SGLang's guided_choice
    choice: tuple[str, ...] = ()
    # How the reply is chosen among `choice`: "tokens" (constrained decoding, vLLM's way) or
    # "likelihood" (each read whole, the likeliest wins: the bundled engine and its server)
    choice_scoring: str = "tokens"
    choice_bias: tuple[float, ...] = ()  # with "likelihood": added to each choice's score
    tools: tuple[ToolSpec, ...] = ()  # the functions the model may call (app/llm/tools.py)
    tool_choice: ToolChoice = ToolChoice()  # OpenAI's: auto, none, required or one function


@dataclass
class Generation:
    text: str  # the answer, without the think part
    model: str
    prompt_tokens: int
    completion_tokens: int  # every generated token, the think part's too
    cached_tokens: int = 0
    finish_reason: str = "stop"
    latency_s: float = 0.0
    reasoning: str = ""  # the think part, if the model had one
    tool_calls: list[ToolCall] = field(default_factory=list)  # finish_reason is then "tool_calls"


@dataclass
class StreamDelta:
    """One piece of a streamed answer (``text``), of its think part (``reasoning``) or of its
    tool calls; the last one carries ``final``."""

    text: str
    final: Generation | None = field(default=None)
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


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
    """Chat completions over HTTP, with timeouts and bounded retries on connection errors/5xx.

    A server with a reasoning parser (vLLM or SGLang ``--reasoning-parser glm45``, hosted GLM
    APIs) sends the think part apart, as ``reasoning_content`` (or vLLM's newer ``reasoning``);
    one without sends it inline in ``content``, which is split here. ``reply_start``
    (``OPENAI_REPLY_START``) says where such a reply begins: ``answer`` (it opens its own
    ``<think>``: GLM-4.5/4.6, or any model that does not think), ``thinking`` (the server's
    template pre-filled ``<think>``: GLM-4.7/GLM-5 without a parser), or ``auto``: content that
    does not open with ``<think>`` is held until ``</think>`` or the end shows what it was (or
    the server sends reasoning apart, which shows it parses), so no thinking is ever taken for
    the answer, at the price of streaming a non-thinking model's answer only at its end.
    """

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 120.0,
                 retries: int = 2,
                 reply_start: str = "auto"):
        if reply_start not in REPLY_STARTS:
            raise ValueError(f"reply_start must be one of {REPLY_STARTS}, got {reply_start!r}")
        self.base_url = base_url.rstrip("/")
        self.model_name = model
        self.timeout = (3.05, timeout_s)
        self.retries = retries
        self.http = HttpPool(self.base_url)  # app/http/pool.py
        self.reply_start = reply_start
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _body(self, messages: list[dict], params: GenerationParams, stream: bool) -> dict:
        body = {"model": self.model_name, "messages": messages, "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "stream": stream}
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if params.enable_thinking is not None:  # vLLM's and SGLang's convention
            body["chat_template_kwargs"] = {"enable_thinking": params.enable_thinking}
        if params.choice:
            body["guided_choice"] = list(params.choice)
            if params.choice_scoring != "tokens":  # `inference serve`'s; other servers ignore it
                body["choice_scoring"] = params.choice_scoring
            if params.choice_bias:
                body["choice_bias"] = list(params.choice_bias)
        if params.tools:  # the server renders and parses them; its calls are used as they come
            body["tools"] = [tool.openai for tool in params.tools]
            body["tool_choice"] = params.tool_choice.as_openai()
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _splitter(self, params: GenerationParams) -> ReasoningSplitter:
        start = self.reply_start
        if start == "thinking" and params.enable_thinking is False:
            start = "answer"  # the template pre-filled an empty think part instead
        return ReasoningSplitter("unknown" if start == "auto" else start)

    def _post(self, body: dict, stream: bool) -> urllib3.BaseHTTPResponse:
        url = f"{self.base_url}/chat/completions"
        for attempt in range(self.retries + 1):
            try:
                resp = self.http.post_json(url, body, headers=self.headers, timeout=self.timeout,
                                           stream=stream)
            except HttpError as exc:
                if attempt == self.retries:
                    raise LLMError(f"model server unreachable: {exc}") from exc
            else:
                if resp.status < 500 and resp.status != 429:
                    break
                if attempt == self.retries:
                    raise LLMError(f"model server answered {resp.status}")
                resp.close()
            time.sleep(min(0.5 * 2**attempt, 4.0))
        if resp.status != 200:
            resp.close()
            raise LLMError(f"model server refused the request ({resp.status})", transient=False,
                           status=resp.status)
        return resp

    def generate(self, messages: list[dict], params: GenerationParams) -> Generation:
        started = time.perf_counter()
        resp = self._post(self._body(messages, params, stream=False), stream=False)
        try:
            data = resp.json()
            choice = data["choices"][0]
            message = choice["message"]
            usage = data.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            apart = _reasoning_of(message)
            splitter = self._splitter(params)
            if apart:
                splitter.assume_answer()
            splitter.feed(message.get("content") or "")
            splitter.finish()
            return Generation(
                text=splitter.answer,
                model=data.get("model", self.model_name),
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
                cached_tokens=int(details.get("cached_tokens") or 0),
                finish_reason=choice.get("finish_reason") or "stop",
                latency_s=time.perf_counter() - started,
                reasoning=apart + splitter.reasoning,
                tool_calls=[_call_of(c) for c in message.get("tool_calls") or []],
            )
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LLMError("model server sent a malformed answer") from exc

    def stream(self, messages: list[dict], params: GenerationParams) -> Iterator[StreamDelta]:
        started = time.perf_counter()
        resp = self._post(self._body(messages, params, stream=True), stream=True)
        splitter = self._splitter(params)
        apart: list[str] = []  # reasoning the server sent apart
        usage: dict = {}
        finish = "stop"
        model = self.model_name
        calls: dict[int, list[str]] = {}  # index -> [id, name, arguments so far]
        with resp:
            for line in _lines(resp):
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
                    delta = choice.get("delta") or {}
                    finish = choice.get("finish_reason") or finish
                    reasoning, text = _reasoning_of(delta), ""
                    if reasoning:
                        apart.append(reasoning)
                        text = splitter.assume_answer()
                    more_reasoning, more_text = splitter.feed(delta.get("content") or "")
                    pieces = _call_pieces(delta.get("tool_calls"), calls)
                    if reasoning or more_reasoning or text or more_text or pieces:
                        yield StreamDelta(text + more_text, reasoning=reasoning + more_reasoning,
                                          tool_calls=pieces)
        reasoning, text = splitter.finish()
        if reasoning or text:
            yield StreamDelta(text, reasoning=reasoning)
        details = usage.get("prompt_tokens_details") or {}
        yield StreamDelta("", Generation(
            text=splitter.answer, model=model, prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            cached_tokens=int(details.get("cached_tokens") or 0), finish_reason=finish,
            latency_s=time.perf_counter() - started, reasoning="".join(apart) + splitter.reasoning,
            tool_calls=[ToolCall(*calls[i]) for i in sorted(calls)]))


def _lines(resp: urllib3.BaseHTTPResponse) -> Iterator[str]:
    """The stream's lines; a connection that breaks or stalls mid-answer is a transient error."""
    try:
        yield from iter_lines(resp)
    except HttpError as exc:
        raise LLMError(f"model server stream broke: {exc}") from exc


def _call_of(call: dict) -> ToolCall:
    """A server's tool call as it came (its id, name and arguments text untouched)."""
    function = call["function"]
    return ToolCall(str(call["id"]), str(function["name"]), str(function.get("arguments") or ""))


def _call_pieces(items, calls: dict[int, list[str]]) -> list[ToolCallDelta]:
    """A stream's ``delta.tool_calls`` as they came, and gathered into ``calls`` by index."""
    pieces = []
    for item in items or []:
        if not isinstance(item, dict) or not isinstance(item.get("index"), int):
            raise LLMError("model server sent a malformed tool call")
        function = item.get("function") or {}
        index, arguments = item["index"], function.get("arguments") or ""
        if index not in calls:
            calls[index] = [str(item.get("id") or ""), str(function.get("name") or ""), ""]
            pieces.append(ToolCallDelta(index, calls[index][0], calls[index][1], arguments))
        else:
            pieces.append(ToolCallDelta(index, arguments=arguments))
        calls[index][2] += arguments
    return pieces


def _reasoning_of(message: dict) -> str:
    """The think part a server sent apart from the content (vLLM's newer name, then the usual)."""
    value = message.get("reasoning_content") or message.get("reasoning")
    return value if isinstance(value, str) else ""


def make_backend(settings) -> LLMBackend:
    """The backend the settings ask for (the engine is loaded here, once per process)."""
    if settings.inference_backend == "openai":
        return OpenAIBackend(settings.openai_base_url, settings.openai_model,
                             settings.openai_api_key.get_secret_value(), settings.openai_timeout_s,
                             reply_start=settings.openai_reply_start)
    from app.llm.engine_backend import EngineBackend

    return EngineBackend.from_settings(settings)
