"""`LLM`: the engine for a script, the command line or an evaluation, as nano-vllm's `LLM(LLMEngine)`.

`LLM.from_pretrained(dir)` loads a checkpoint into one `LLMEngine` (inference/engine/: the paged
cache, continuous batching, prefix caching, MTP speculative decoding): `generate(prompts, params)`
runs a batch to the end, `stream(prompt, params)` hands one request's outputs over step by step,
for text as it comes. Every generation goes through the engine's step loop; there is no second
path for one sequence.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from inference.engine import EngineArgs, LLMEngine, RequestOutput
from inference.engine.sequence import Prompt
from inference.sampling_params import SamplingParams


class LLM(LLMEngine):
    """Without a tokenizer (a checkpoint directory with no `tokenizer.json`) it works on token ids
    only: prompts must be ids, `text` stays empty and stop strings are refused."""

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **engine_args) -> LLM:
        """Load config, weights and tokenizer; `engine_args` are `EngineArgs` fields: `dtype`,
        `device`, `sliding_window`/`global_interval` (a dense GLM-4 checkpoint as union-mode
        sparse attention, or GLM-5's overridden), `quantization="w8a16"` (int8 weight-only linear
        layers), `speculative_k` (MTP drafts per step), the cache's and the batch's sizes."""
        return cls.from_engine_args(EngineArgs(model=str(model_dir), **engine_args))

    def stream(self, prompt: Prompt, params: SamplingParams | None = None,
               speculative_k: int | None = None) -> Iterator[RequestOutput]:
        """One request's outputs, one per step that added to it (`delta`: the text it added), the
        last one `finished`; requests already queued here step alongside it. Closing the iterator
        early aborts the request."""
        request_id = self.add_request(prompt, params, speculative_k=speculative_k)
        finished = False
        try:
            while not finished:
                for output in self.step():
                    if output.request_id == request_id:
                        finished = output.finished
                        yield output
        finally:
            if not finished:
                self.abort_request(request_id)
