"""The bundled engine behind the worker's model interface (``worker.llm.LLMBackend``).

One engine per worker process, loaded on first use. Until the batching engine service serves
several requests in one batch, requests take turns on the single-sequence ``inference.LLM``
(a lock: the model's forward is not re-entrant).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

from inference.llm import LLM
from inference.sampling_params import SamplingParams
from worker.llm import Generation, GenerationParams, LLMError, StreamDelta


class EngineBackend:
    def __init__(self, llm: LLM, model_name: str):
        self.llm = llm
        self.model_name = model_name
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings) -> EngineBackend:
        path = Path(settings.model_dir)
        if not (path / "config.json").exists():
            raise LLMError(f"no model at {path} (MODEL_DIR)", transient=False)
        return cls(LLM.from_pretrained(str(path)), path.name)

    @staticmethod
    def _params(params: GenerationParams) -> SamplingParams:
        return SamplingParams(temperature=params.temperature, top_p=params.top_p,
                              max_tokens=params.max_tokens, stop=list(params.stop), seed=params.seed)

    def generate(self, messages: list[dict], params: GenerationParams) -> Generation:
        final = None
        for delta in self.stream(messages, params):
            final = delta.final or final
        return final

    def stream(self, messages: list[dict], params: GenerationParams) -> Iterator[StreamDelta]:
        started = time.perf_counter()
        with self._lock:
            try:
                generation = self.llm.stream(messages, self._params(params))
                for text in generation:
                    if text:
                        yield StreamDelta(text)
                result = generation.result
            except (RuntimeError, ValueError) as exc:
                raise LLMError(f"engine failed: {type(exc).__name__}", transient=False) from exc
        yield StreamDelta("", Generation(
            text=result.text, model=self.model_name, prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens, finish_reason=result.finish_reason,
            latency_s=time.perf_counter() - started))
