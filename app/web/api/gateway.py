"""One /v1 call's path beside the model: budget, generation, usage, audit.

The web process calls the model itself, through ``app.llm.make_backend(settings)``: one
backend per gunicorn worker process, built on the first request. With ``INFERENCE_BACKEND=openai``
that is an HTTP client to a model server (vLLM, SGLang, or a dedicated process running the
bundled engine behind an OpenAI-compatible front), which is what production uses: each web
worker holding its own copy of the engine would multiply GPU memory by the number of workers and
batch nothing across them. ``engine`` works too (one engine per web worker, batched inside it)
and is fine for a one-worker demo.

Accounting is the message path's: the API key is the actor (``api_key:<name>`` as the usage
row's user, the key's name as ``api_key_id``, so ``api_key`` budgets apply), the worst case is
reserved before the call and settled after it with the larger of the reported and the estimated
counts, priced by the configured model (``app.accounting``); a charge that fails leaves the
reservation, charged its worst case when it expires. Every authenticated call
leaves one ``api_request`` audit event; its payload (the conversation and the answer, cut at
``AUDIT_TEXT_CHARS`` each) is AES-GCM sealed like every audit payload.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from app.accounting import (
    Accounting,
    Admission,
    Usage,
    estimate_choice_tokens,
    estimate_completion_tokens,
    estimate_prompt_tokens,
    period_end,
    period_start,
)
from app.audit.chain import EventType
from app.db import utcnow
from app.llm import Generation, LLMBackend, make_backend
from app.metrics import counters as metrics
from app.web.api.errors import ApiError
from app.web.api.keys import Caller
from app.web.api.validation import ChatRequest

log = logging.getLogger(__name__)
AUDIT_TEXT_CHARS = 4000


class Gateway:
    def __init__(self, services, backend_factory=make_backend):
        self.services = services
        self.settings = services.settings
        self._factory = backend_factory
        self._backend: LLMBackend | None = None
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        """The one model served, named without loading it."""
        s = self.settings
        return s.openai_model if s.inference_backend == "openai" else Path(s.model_dir).name

    @property
    def backend(self) -> LLMBackend:
        with self._lock:  # several request threads may arrive first at once
            if self._backend is None:
                self._backend = self._factory(self.settings)
            return self._backend

    @property
    def accounting(self) -> Accounting:
        return self.services.accounting

    # -- budget ----------------------------------------------------------------------------------
    def admit(self, caller: Caller, chat: ChatRequest) -> Admission:
        """Reserve the call's worst case, or raise 429 when an ``api_key`` (or global) budget
        that blocks is used up; ``Retry-After`` is the time until its period ends."""
        # guided_choice's replies are processed like prompt tokens: counted in the reservation,
        # which the settle charges at least (``Accounting.settle``)
        # and so are the tools offered (a long list of tools is never a way around a budget)
        prompt_tokens = estimate_prompt_tokens(chat.messages, chat.tools) + estimate_choice_tokens(chat.params.choice)
        admission = self.accounting.reserve(
            caller.actor[:64], "", self.model_name, prompt_tokens, chat.params.max_tokens,
            api_key_id=caller.name)
        if admission.allowed:
            return admission
        budget, now = admission.blocked_by, utcnow()
        tz = self.settings.timezone
        end = period_end(budget.period, period_start(budget.period, now, tz), tz)
        raise ApiError(429, f"the {budget.scope} budget for this {budget.period} is used up "
                       f"({admission.spent} of {budget.limit} {budget.currency})",
                       code="insufficient_quota", type="insufficient_quota", retry_after=max(1, int((end - now).total_seconds())))

    def settle(self, admission: Admission, caller: Caller, generation: Generation) -> None:
        try:
            self.accounting.settle(admission, Usage(
                user_hash=caller.actor[:64], department="", model=self.model_name[:64],
                prompt_tokens=generation.prompt_tokens,
                completion_tokens=generation.completion_tokens,
                cached_tokens=generation.cached_tokens,
                latency_ms=int(generation.latency_s * 1000), api_key_id=caller.name,
                estimated_completion_tokens=estimate_completion_tokens(
                    generation.text + "".join(c.name + c.arguments for c in generation.tool_calls),
                    generation.reasoning)))
            metrics.generation(self.model_name[:64], generation.completion_tokens,
                               generation.latency_s)
        except Exception:  # noqa: BLE001 - the answer is out; the reservation stays, charged
            # its worst case when it expires
            log.exception("usage not recorded api_key=%s", caller.name)

    def release(self, admission: Admission | None) -> None:
        if admission is None:
            return
        try:
            self.accounting.release(admission)
        except Exception:  # noqa: BLE001 - expires after BUDGET_RESERVATION_TTL_S anyway
            log.exception("reservation not released")

    # -- audit -----------------------------------------------------------------------------------
    def audit(self, caller: Caller, outcome: str, *, request_id: str | None, fingerprint: str,
              chat: ChatRequest | None = None, answer: str | None = None,
              generation: Generation | None = None, error: str | None = None) -> None:
        payload: dict = {"api_key": caller.name, "model": self.model_name}
        if chat is not None:
            payload["stream"] = chat.stream
            payload["max_tokens"] = chat.params.max_tokens
            payload["messages"] = [{"role": m["role"], "content": m["content"][:AUDIT_TEXT_CHARS]}
                                   for m in chat.messages[-20:]]
        if answer is not None:
            payload["answer"] = answer[:AUDIT_TEXT_CHARS]
        if chat is not None and chat.tools:
            payload["tools"] = [tool.name for tool in chat.params.tools]
        if generation is not None and generation.tool_calls:
            payload["tool_calls"] = [{"name": c.name, "arguments": c.arguments[:AUDIT_TEXT_CHARS]}
                                     for c in generation.tool_calls]
        if generation is not None:
            payload.update(prompt_tokens=generation.prompt_tokens,
                           completion_tokens=generation.completion_tokens,
                           finish_reason=generation.finish_reason)
        if error:
            payload["error"] = error
        try:
            self.services.audit.record(self.services.db, EventType.API_REQUEST, actor=caller.actor,
                                       outcome=outcome, request_id=request_id,
                                       fingerprint=fingerprint, payload=payload)
        except Exception:  # noqa: BLE001 - logged; the reply is already decided
            log.exception("audit event not written api_key=%s request_id=%s", caller.name,
                          request_id)
