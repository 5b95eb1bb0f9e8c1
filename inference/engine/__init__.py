"""The engine, the one generation path: paged KV cache, prefix caching, continuous batching,
chunked prefill (`inference.llm.LLM` is this engine with a loader).

`LLMEngine` (llm_engine.py) steps a `Scheduler` (scheduler.py) over `Sequence`s (sequence.py)
whose KV blocks a `BlockManager` (block_manager.py) hands out; `ModelRunner` (model_runner.py)
runs one batch on the paged cache, whose pools and sizes the model's cache layout owns
(inference/layers/caches/layouts.py); sequences with a speculative k draft with the MTP heads
(drafting.py, speculative.py) and are verified in that same batch. On CUDA, decode-only steps replay graphs
captured per batch-size bucket (cuda_graphs.py). A request held to given replies is decoded
constrained to them (choices.py) or has each scored whole, in sequences of its own (choice_scoring.py).
"""

from inference.engine.errors import EngineError, PromptTooLongError, RequestFailedError
from inference.engine.llm_engine import EngineArgs, LLMEngine, RequestOutput

__all__ = ["EngineArgs", "EngineError", "LLMEngine", "PromptTooLongError", "RequestFailedError", "RequestOutput"]
