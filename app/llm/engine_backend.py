"""The bundled engine behind the worker's model interface (``app.llm.LLMBackend``).

One engine per worker process (``inference.engine.service``), loaded on first use; every task
thread submits to it, so concurrent chats share batches. Engine errors become ``LLMError``s the
processor turns into a polite message: a prompt over ``max_model_len`` is the user's (400, not
retried), a device failure such as out-of-memory is transient (503, retried).

The prompt is laid out here, with the checkpoint's chat layout and ``enable_thinking``, and a
reasoning model's text is split into its think part and its answer as it streams: the tokenizer
says whether a reply begins inside a think part its prompt opened (GLM-4.7 and later). Tools are
the model server's way (``inference.reply``): shown in the prompt, forced by ``tool_choice``,
the calls parsed from the answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

from app.llm import Generation, GenerationParams, LLMError, StreamDelta
from inference.engine import EngineArgs, LLMEngine, PromptTooLongError, RequestFailedError
from inference.engine.service import EngineService
from inference.layers.kernels import cpu_kernels
from inference.reply import ReplyReader, ToolUse, tool_use
from inference.sampling_params import SamplingParams

log = logging.getLogger(__name__)
TOO_LONG = "Your conversation is too long for the model. Please shorten the message or start a new chat."


class EngineBackend:
    def __init__(self, service: EngineService, model_name: str):
        self.service = service
        self.model_name = model_name

    @classmethod
    def from_settings(cls, settings) -> EngineBackend:
        path = Path(settings.model_dir)
        if not (path / "config.json").exists():
            raise LLMError(f"no model at {path} (MODEL_DIR)", transient=False)
        args = EngineArgs(
            model=str(path),
            max_num_seqs=settings.engine_max_num_seqs,
            max_model_len=settings.engine_max_model_len,
            kv_cache_bytes=settings.engine_kv_cache_bytes,
            speculative_k=settings.engine_speculative_k,
        )
        try:
            engine = LLMEngine.from_engine_args(args)
        except ValueError as exc:  # e.g. ENGINE_SPECULATIVE_K for a checkpoint without MTP heads
            raise LLMError(f"engine settings refused: {exc}", transient=False) from exc
        if engine.model.device.type == "cpu":  # built now, not on the first request; the log says which
            log.info("engine: %s", cpu_kernels.describe())
        if args.speculative_k:
            log.info("engine decodes with MTP speculative decoding, %d drafts per step", args.speculative_k)
        if engine.mtp_cache_bytes:
            log.info("engine: MTP caches of speculative sequences take at most mtp_cache_bytes=%d",
                     engine.mtp_cache_bytes)
        return cls(EngineService(engine), path.name)

    @staticmethod
    def _params(params: GenerationParams, tools: ToolUse) -> SamplingParams:
        return SamplingParams(temperature=params.temperature, top_p=params.top_p,
                              max_tokens=params.max_tokens, stop=list(params.stop), seed=params.seed,
                              choice=list(params.choice), choice_scoring=params.choice_scoring,
                              choice_bias=list(params.choice_bias), tool_call=tools.forced)

    def generate(self, messages: list[dict], params: GenerationParams) -> Generation:
        final = None
        for delta in self.stream(messages, params):
            final = delta.final or final
        return final

    def stream(self, messages: list[dict], params: GenerationParams) -> Iterator[StreamDelta]:
        started = time.perf_counter()
        tokenizer = self.service.engine.tokenizer
        thinking = params.enable_thinking is not False
        try:
            tools = ToolUse()
            if params.tools and params.tool_choice.mode != "none":
                if tokenizer is None:
                    raise ValueError("tools need a model with a tokenizer")
                tools = tool_use(tokenizer, params.tools, params.tool_choice, thinking)
            reader = ReplyReader(tokenizer, thinking, tools.read)
            sampling = self._params(params, tools)
            prompt = messages
            if tokenizer is not None and messages and isinstance(messages[0], dict):
                prompt = tokenizer.apply_chat_template(messages, enable_thinking=thinking, tools=tools.shown)
            output = None
            for output in self.service.submit(prompt, sampling):
                if output.delta and (piece := reader.feed(output.delta)):
                    yield StreamDelta(piece.content, reasoning=piece.reasoning, tool_calls=piece.tool_calls)
        except PromptTooLongError as exc:
            raise LLMError(TOO_LONG, transient=False, status=400) from exc
        except RequestFailedError as exc:
            raise LLMError(f"engine failed this request: {exc}", transient=True, status=503) from exc
        except ValueError as exc:
            raise LLMError(f"engine refused the request: {exc}", transient=False, status=400) from exc
        if piece := reader.finish():
            yield StreamDelta(piece.content, reasoning=piece.reasoning, tool_calls=piece.tool_calls)
        yield StreamDelta("", Generation(
            text=reader.content, model=self.model_name, prompt_tokens=output.prompt_tokens,
            completion_tokens=output.completion_tokens, cached_tokens=output.cached_tokens,
            finish_reason=reader.finish_reason(output.finish_reason), latency_s=time.perf_counter() - started,
            reasoning=reader.reasoning, tool_calls=list(reader.tool_calls)))

    def close(self) -> None:
        self.service.close()
