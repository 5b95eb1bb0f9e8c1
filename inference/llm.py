"""Single-request generation: `LLM.from_pretrained(dir).generate(prompt, SamplingParams())`.

One sequence, one `KVCache`: the prompt is prefilled in chunks of `prefill_chunk` tokens (so a
32k prompt never materialises 32k-wide activations), then one token per step. Continuous batching
and the paged cache come later on top of the same model forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.config import ModelConfig
from inference.kv_cache import KVCache
from inference.layers.sampler import Sampler
from inference.loader import load_model
from inference.models.glm5_sparse import Glm5SparseForCausalLM
from inference.sampling_params import SamplingParams
from inference.speculative import SpeculativeDecoder, SpeculativeStats
from inference.tokenizer import ChatTokenizer, StopStringMatcher

Prompt = str | list[int] | list[dict]


@dataclass
class GenerationResult:
    """`token_ids` are the completion's tokens, a final eos included (it is generated and billed)
    but not rendered in `text`. `finish_reason`: "stop" (eos or stop string) or "length"."""

    token_ids: list[int]
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class _TextOut:
    """Completion tokens to text deltas: incremental detokenization, then stop strings."""

    def __init__(self, tokenizer: ChatTokenizer | None, stop: list[str]) -> None:
        self.detok = tokenizer.detokenizer() if tokenizer is not None else None
        self.stopper = StopStringMatcher(stop) if stop else None
        self.fed, self.text, self.stopped = "", "", False

    def push(self, token: int) -> str:
        return "" if self.detok is None else self._feed(self.detok.push(token))

    def flush(self) -> str:
        """The text still held back at the end: an unfinished character, a stop-string prefix."""
        if self.detok is None or self.stopped:
            return ""
        delta = self._feed(self.detok.flush())
        if self.stopper is not None and not self.stopped:
            delta += self.fed[len(self.text) :]
            self.text = self.fed
        return delta

    def _feed(self, piece: str) -> str:
        if self.stopper is not None:
            self.fed += piece
            piece, self.stopped = self.stopper.feed(piece)
        self.text += piece
        return piece


class Generation:
    """A generation in progress: iterate it for text deltas; `result` is set once it ends."""

    def __init__(
        self, llm: LLM, prompt_ids: list[int], params: SamplingParams, speculative_k: int | None = None
    ) -> None:
        if not prompt_ids:
            raise ValueError("empty prompt")
        if params.stop and llm.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        self.llm, self.prompt_ids, self.params = llm, prompt_ids, params
        self.speculative_k = speculative_k
        self.speculative_stats: SpeculativeStats | None = None  # set once iteration starts
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[str]:
        llm, params = self.llm, self.params
        generator = None
        if params.seed is not None:
            generator = torch.Generator(llm.model.device).manual_seed(params.seed)
        out = _TextOut(llm.tokenizer, params.stop)
        completion, finish = [], "length"
        if self.speculative_k:
            decoder = SpeculativeDecoder(llm.model, llm.sampler, self.speculative_k, llm.prefill_chunk)
            self.speculative_stats = decoder.stats
            tokens = decoder.tokens(self.prompt_ids, params, generator)
        else:
            tokens = self._plain_tokens(generator)
        for token in tokens:
            completion.append(token)
            if token in llm.eos_token_ids and not params.ignore_eos:
                finish = "stop"
                break
            if delta := out.push(token):
                yield delta
            if out.stopped:
                finish = "stop"
                break
            if len(completion) >= params.max_tokens:
                break
        tokens.close()
        if delta := out.flush():
            yield delta
        if out.stopped:
            finish = "stop"
        self.result = GenerationResult(completion, out.text, len(self.prompt_ids), len(completion), finish)

    def _plain_tokens(self, generator: torch.Generator | None) -> Iterator[int]:
        """One token per model step; the next step runs only if the caller asks for more."""
        llm, params = self.llm, self.params
        cache = llm.model.new_cache()
        history = list(self.prompt_ids)
        logits = llm.prefill(self.prompt_ids, cache)
        while True:
            token = int(llm.sampler(logits, [params], [history], [generator])[0])
            history.append(token)
            yield token
            logits = llm.decode(token, len(history) - 1, cache)


class LLM:
    """The engine for one request at a time.

    Without a tokenizer (a checkpoint directory with no `tokenizer.json`) it works on token ids
    only: prompts must be ids, `text` stays empty and stop strings are refused.
    `speculative_k` (1..8, or None for plain decoding) drafts that many tokens per step with the
    model's MTP heads (`inference.speculative`); `stream`/`generate` can override it per request.
    """

    def __init__(
        self,
        model: Glm5SparseForCausalLM,
        tokenizer: ChatTokenizer | None = None,
        eos_token_ids: list[int] | None = None,
        prefill_chunk: int = 2048,
        speculative_k: int | None = None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.speculative_k = speculative_k
        self.eos_token_ids = set(eos_token_ids or (tokenizer.eos_token_ids if tokenizer else []))
        self.prefill_chunk = prefill_chunk
        self.sampler = Sampler()

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | None = None,
        sliding_window: int | None = None,
        global_interval: int | None = None,
        quantization: str | None = None,
        speculative_k: int | None = None,
    ) -> LLM:
        """Load config, weights and tokenizer; `sliding_window`/`global_interval` turn a dense
        GLM-4 checkpoint into union-mode sparse attention (or override GLM-5's);
        `quantization="w8a16"` makes the linear layers int8 weight-only at load time."""
        model_dir = Path(model_dir)
        config = ModelConfig.from_pretrained(
            model_dir,
            dtype=dtype,
            sliding_window=sliding_window,
            global_interval=global_interval,
            quantization=quantization,
        )
        model = load_model(model_dir, config, device)
        tokenizer = None
        if (model_dir / "tokenizer.json").exists():
            tokenizer = ChatTokenizer.from_pretrained(model_dir)
        return cls(model, tokenizer, config.eos_token_ids, speculative_k=speculative_k)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """Token ids as given, text encoded, or chat messages through the chat template."""
        if isinstance(prompt, str):
            return self._need_tokenizer().encode(prompt)
        if prompt and isinstance(prompt[0], dict):
            return self._need_tokenizer().apply_chat_template(prompt, add_generation_prompt=True)
        return list(prompt)

    def _need_tokenizer(self) -> ChatTokenizer:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids")
        return self.tokenizer

    @torch.inference_mode()
    def prefill(self, ids: list[int], cache: KVCache) -> torch.Tensor:
        """Run the prompt through the model in chunks; logits `[1, vocab]` of its last position."""
        device, start = self.model.device, cache.length
        for a in range(0, len(ids), self.prefill_chunk):
            chunk = torch.tensor(ids[a : a + self.prefill_chunk], device=device)
            positions = torch.arange(start + a, start + a + len(chunk), device=device)
            hidden = self.model(chunk, positions, cache)
        return self.model.compute_logits(hidden[-1:])

    @torch.inference_mode()
    def decode(self, token: int, position: int, cache: KVCache) -> torch.Tensor:
        """One step: logits `[1, vocab]` after `token` at `position`."""
        device = self.model.device
        ids = torch.tensor([token], device=device)
        positions = torch.tensor([position], device=device)
        return self.model.compute_logits(self.model(ids, positions, cache))

    def stream(
        self, prompt: Prompt, params: SamplingParams | None = None, speculative_k: int | None = None
    ) -> Generation:
        """Iterate the returned `Generation` for text deltas; read `.result` after the loop."""
        if params is not None and params.choice:
            raise ValueError("choice is the serving engine's (inference.engine.LLMEngine), not LLM's")
        k = self.speculative_k if speculative_k is None else speculative_k
        return Generation(self, self.prompt_ids(prompt), params or SamplingParams(), k or None)

    def generate(
        self, prompt: Prompt, params: SamplingParams | None = None, speculative_k: int | None = None
    ) -> GenerationResult:
        """`speculative_k=0` forces plain decoding on an LLM made with a default k."""
        generation = self.stream(prompt, params, speculative_k)
        for _ in generation:
            pass
        return generation.result
