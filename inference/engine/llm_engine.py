"""The serving engine: `add_request`, then `step()` until done (or `generate` for a batch).

Each step: the scheduler picks the batch, the model runner computes it on the paged cache and
samples (or, for speculative sequences, drafts with the MTP heads and verifies), and
postprocessing appends the tokens, streams text and retires finished requests.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from inference.config import ModelConfig
from inference.engine.block_manager import BlockManager
from inference.engine.choice_scoring import ChoiceScoring
from inference.engine.choices import Choices
from inference.engine.errors import PromptTooLongError, RequestFailedError
from inference.engine.model_runner import ModelRunner
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Prompt, Sequence, TextOut
from inference.engine.speculative import MAX_DRAFT, SpeculativeStats, no_mtp_message
from inference.engine.tool_constraint import ToolCallConstraint
from inference.layers.caches.layouts import cache_layout
from inference.layers.sampler import generator_for
from inference.loader import load_model
from inference.sampling_params import SamplingParams
from inference.tokenizer import ChatTokenizer

log = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 1 << 30


@dataclass
class EngineArgs:
    """Engine settings, named as vLLM names them. The KV budget is `kv_cache_bytes` when set,
    else on CUDA `gpu_memory_utilization` of the device memory minus what is already in use
    (weights), else 1 GiB on CPU. `max_model_len` defaults to what one sequence can hold.
    `quantization="w8a16"` makes the linear layers int8 weight-only at load time.
    `speculative_k`: MTP drafts per step for requests that do not choose (0 = plain decoding).
    `enforce_eager`: never replay decode steps from CUDA graphs (inference/engine/cuda_graphs.py;
    by default they are captured on CUDA, for the models whose decode allows it).

    A model with MTP heads also keeps, per speculative sequence, its MTP layers' caches outside
    the paged cache (`inference.engine.drafting`), each bounded by `max_model_len`: at most
    `LLMEngine.mtp_cache_bytes` for `max_num_seqs` sequences. A budget the engine works out
    (CUDA, CPU default) sets that much aside; `kv_cache_bytes` is the paged cache alone."""

    model: str | None = None
    block_size: int = 64
    enable_prefix_caching: bool = True
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None
    scheduler_policy: str = "fcfs"
    dtype: str | None = None
    device: str | None = None
    quantization: str | None = None
    sliding_window: int | None = None
    global_interval: int | None = None
    speculative_k: int = 0
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        if self.scheduler_policy != "fcfs":
            raise ValueError(f"scheduler_policy {self.scheduler_policy!r}: only 'fcfs' is supported")
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be positive")
        if not 0 <= self.speculative_k <= MAX_DRAFT:
            raise ValueError(f"speculative_k must be in 0..{MAX_DRAFT}, got {self.speculative_k}")


@dataclass
class RequestOutput:
    """One request's progress after a step: `delta`/`new_token_ids` are what this step added,
    `text`/`token_ids` the completion so far. `finish_reason`: "stop", "length", "error" (with
    `error`) or "abort"."""

    request_id: str
    new_token_ids: list[int]
    delta: str
    token_ids: list[int]
    text: str
    prompt_tokens: int
    cached_tokens: int
    finished: bool
    finish_reason: str | None = None
    error: Exception | None = field(default=None, repr=False)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


class LLMEngine:
    """The one generation path: requests in (`add_request`), a step at a time out (`step`);
    `LLM` (inference/llm.py) is this with a loader and a stream for one prompt."""

    def __init__(self, model, tokenizer: ChatTokenizer | None = None, args: EngineArgs | None = None,
                 eos_token_ids: list[int] | None = None) -> None:
        self.args = args = args or EngineArgs()
        self.model, self.tokenizer, config = model, tokenizer, model.config
        eos = list(eos_token_ids or config.eos_token_ids or (tokenizer.eos_token_ids if tokenizer else []))
        self.eos_token_ids = set(eos)
        self.end_token_id = eos[0] if eos else None  # what ends a reply written for the model
        dtype = model.model.embed_tokens.weight.dtype
        # MTP caches are sized for the longest a sequence may get (plus a round of drafts)
        self.mtp_positions = min(args.max_model_len or config.max_position_embeddings,
                                 config.max_position_embeddings) + MAX_DRAFT + 1
        self.layout = cache_layout(config)
        self.mtp_cache_bytes = (args.max_num_seqs * config.num_mtp_heads
                                * self.layout.layer_cache_bytes(dtype, self.mtp_positions))
        num_blocks = self._kv_budget(model.device) // self.layout.bytes_per_block(args.block_size, dtype)
        self.runner = ModelRunner(model, num_blocks, args.block_size, self.mtp_positions, args.enforce_eager)
        num_blocks = self.runner.num_blocks  # (one fewer where CUDA graphs keep a scratch block)
        prefix_caching = args.enable_prefix_caching
        if prefix_caching and not getattr(self.layout, "supports_prefix_caching", True):
            log.warning("%s", self.layout.prefix_caching_refused)  # a recurrent state a sequence (glm5_next)
            prefix_caching = False
        self.block_manager = BlockManager(num_blocks, args.block_size, config.sliding_window,
                                          config.global_interval, self.runner.cache.num_node_pages, prefix_caching)
        self.max_model_len = self._max_model_len(num_blocks)
        self.runner.capture_graphs(args.max_num_seqs, self.max_model_len)
        self.scheduler = Scheduler(self.block_manager, args.max_num_seqs, args.max_num_batched_tokens,
                                   self.max_model_len)
        if args.speculative_k:
            self._check_speculative(args.speculative_k)
        self.requests: dict[str, Sequence] = {}
        self._ids = itertools.count()

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        model_dir = Path(args.model)
        config = ModelConfig.from_pretrained(model_dir, dtype=args.dtype, sliding_window=args.sliding_window,
                                             global_interval=args.global_interval, quantization=args.quantization)
        model = load_model(model_dir, config, args.device)
        tokenizer = ChatTokenizer.from_pretrained(model_dir) if (model_dir / "tokenizer.json").exists() else None
        return cls(model, tokenizer, args, config.eos_token_ids)

    @property
    def speculative_stats(self) -> SpeculativeStats:
        """Drafts proposed and accepted per draft position and accepted lengths, summed over
        every speculative request so far (`worker/observability/metrics.py` exports them)."""
        return self.runner.stats

    def _check_speculative(self, k: int) -> None:
        if not 0 <= k <= MAX_DRAFT:
            raise ValueError(f"speculative_k must be in 0..{MAX_DRAFT}, got {k}")
        if k and not self.model.config.num_mtp_heads:
            raise ValueError(no_mtp_message(self.model.config))

    def _kv_budget(self, device: torch.device) -> int:
        """Bytes for the paged cache: `kv_cache_bytes`, or what the device allows less the MTP
        caches' share."""
        if self.args.kv_cache_bytes is not None:
            return self.args.kv_cache_bytes
        if device.type == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            budget = int(free - total * (1 - self.args.gpu_memory_utilization))
        else:
            budget = CPU_KV_CACHE_BYTES
        if self.mtp_cache_bytes >= budget:
            raise ValueError(
                f"the MTP caches of {self.args.max_num_seqs} sequences ({self.mtp_cache_bytes} bytes) "
                f"leave nothing of the KV budget ({budget} bytes): lower max_num_seqs or max_model_len")
        return budget - self.mtp_cache_bytes

    def _max_model_len(self, num_blocks: int) -> int:
        """`max_model_len`, or by default the longest sequence the cache holds on its own
        (`longest_sequence` of the layout, sparse: the window's blocks plus a node page per block
        of the sequence)."""
        config, b = self.model.config, self.args.block_size
        limit = min(self.layout.longest_sequence(num_blocks, b), config.max_position_embeddings)
        if self.args.max_model_len is None:
            wanted = limit
        elif self.args.max_model_len > limit:
            raise ValueError(f"max_model_len {self.args.max_model_len} does not fit the KV cache "
                             f"({num_blocks} blocks of {b}: at most {limit}); give it more memory")
        else:
            wanted = self.args.max_model_len
        if wanted < 2:
            raise ValueError(f"the KV cache ({num_blocks} blocks of {b}) is too small for any request")
        return wanted

    # -- requests ------------------------------------------------------------------------------
    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], dict)):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass token ids")
            if isinstance(prompt, str):
                return self.tokenizer.encode(prompt)
            return self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
        return list(prompt)

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None,
                    request_id: str | None = None, speculative_k: int | None = None) -> str:
        """Queue a request; raises `PromptTooLongError` when the prompt leaves no room for one
        new token within `max_model_len`, `ValueError` for an empty prompt. `speculative_k`
        (1..8 drafts per step, 0 plain) overrides `EngineArgs.speculative_k` for this request."""
        params = params or SamplingParams()
        k = self.args.speculative_k if speculative_k is None else speculative_k
        self._check_speculative(k)
        ids = self.prompt_ids(prompt)
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(len(ids), self.max_model_len)
        if (params.stop or params.choice) and self.tokenizer is None:
            raise ValueError("stop strings and choices need a tokenizer")
        choices = None
        if params.choice:  # drafts would bypass the constraint; its forced tail is faster anyway
            if self.end_token_id is None:
                raise ValueError("choices need an end-of-sequence token")
            choices = Choices([self.tokenizer.reply_ids(c) for c in params.choice], self.end_token_id,
                              params.choice_bias)
            k = 0
        elif params.tool_call is not None:  # held to the call format, like choices
            if self.tokenizer is None or not self.eos_token_ids:
                raise ValueError("a forced tool call needs a tokenizer and an end-of-sequence token")
            choices = ToolCallConstraint(self.tokenizer, params.tool_call, sorted(self.eos_token_ids))
            k = 0
        request_id = request_id or str(next(self._ids))
        seq = Sequence(request_id, ids, params, TextOut(self.tokenizer, params.stop),
                       generator_for(params, self.model.device), k)
        if isinstance(choices, Choices) and params.choice_scoring == "likelihood":
            seq.scoring = ChoiceScoring(seq, choices.replies, choices.bias)
            if seq.scoring.longest > self.max_model_len:  # the longest reply is read whole
                raise PromptTooLongError(seq.scoring.longest, self.max_model_len)
        else:
            seq.choices = choices
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort_request(self, request_id: str) -> None:
        seq = self.requests.pop(request_id, None)
        if seq is not None and not seq.is_finished:
            self._end(seq, "abort")

    def _end(self, seq: Sequence, reason: str, error: Exception | None = None) -> None:
        """Finish a request's sequence, and the ones scoring its choices if it has them."""
        self.scheduler.finish(seq, reason, error)
        for child in seq.scoring.children if seq.scoring is not None else ():
            if not child.is_finished:
                self.scheduler.finish(child, "abort")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step loop -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        try:
            results = self.runner.run(batch)
        except torch.OutOfMemoryError as exc:
            # Fail the request with the most tokens in the step (the likeliest cause); the others
            # keep their blocks and are simply scheduled again (their positions get rewritten).
            # Drafters may have run ahead: they start afresh from what the cache holds.
            for other, _ in batch:
                other.drafts = None
            seq = max(batch, key=lambda item: item[1])[0]
            seq = seq.scoring.parent if seq.scoring is not None else seq  # a request's, not a choice's
            error = RequestFailedError(f"out of memory on {self.model.device.type} running request {seq.request_id}")
            error.__cause__ = exc
            self._end(seq, "error", error)
            self.requests.pop(seq.request_id, None)
            return [self._output(seq, [], "")]
        outputs = []
        for (seq, _), result in zip(batch, results, strict=True):
            if result.tokens:
                outputs.append(self._postprocess(seq, result.tokens))
            if not seq.is_finished:
                self.scheduler.advance(seq, result.kept)
                if seq.scoring is not None and seq.num_computed_tokens == seq.num_tokens:
                    outputs += self._scored(seq)
        return outputs

    def _scored(self, seq: Sequence) -> list[RequestOutput]:
        """A sequence of a request scoring its choices has its rows computed: after the prompt
        come the replies, and after the last reply the request's answer."""
        scoring = seq.scoring
        if seq is scoring.parent:
            self.scheduler.hand_over(seq, scoring.spawn())
            return []
        self.scheduler.finish(seq, "stop")
        if not scoring.done():
            return []
        parent = scoring.parent
        return [self._postprocess(parent, scoring.pick(parent.params.temperature, parent.generator))]

    def _postprocess(self, seq: Sequence, tokens: list[int]) -> RequestOutput:
        """Append the step's tokens one by one, stopping at the first that ends the request
        (EOS, a stop string, `max_tokens`, `max_model_len`): accepted drafts past it are dropped."""
        out, params, reason = seq.text_out, seq.params, None
        delta, new = "", []
        for token in tokens:
            seq.token_ids.append(token)
            new.append(token)
            if token in self.eos_token_ids and not params.ignore_eos:
                reason = "stop"
            else:
                delta += out.push(token)
                if out.stopped:
                    reason = "stop"
                elif seq.num_completion_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
                    reason = "length"
            if reason is not None:
                break
        if reason is not None:
            delta += out.flush()
            self.scheduler.finish(seq, reason)
            self.requests.pop(seq.request_id, None)
        return self._output(seq, new, delta)

    def _output(self, seq: Sequence, new: list[int], delta: str) -> RequestOutput:
        return RequestOutput(seq.request_id, new, delta, seq.completion_token_ids, seq.text_out.text,
                             seq.num_prompt_tokens, seq.num_cached_tokens, seq.is_finished,
                             seq.finish_reason, seq.error)

    def generate(self, prompts: list[Prompt], params: SamplingParams | list[SamplingParams] | None = None,
                 speculative_k: int | list[int | None] | None = None) -> list[RequestOutput]:
        """Run a batch to the end; the final output of each prompt, in order. `speculative_k`:
        one for all, or one per prompt (None: `EngineArgs.speculative_k`)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("generate takes a list of prompts: wrap one prompt in a list")
        if not isinstance(params, list):
            params = [params or SamplingParams()] * len(prompts)
        if not isinstance(speculative_k, list):
            speculative_k = [speculative_k] * len(prompts)
        ids = [self.add_request(p, sp, speculative_k=k)
               for p, sp, k in zip(prompts, params, speculative_k, strict=True)]
        final: dict[str, RequestOutput] = {}
        while len(final) < len(ids):
            for output in self.step():
                if output.finished:
                    final[output.request_id] = output
        return [final[i] for i in ids]
