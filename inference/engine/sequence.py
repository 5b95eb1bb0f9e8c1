"""A request's state: its tokens, how many of them the cache holds, its blocks, and its text so far."""

from __future__ import annotations

import enum
import time
from typing import Any

import torch

from inference.sampling_params import SamplingParams
from inference.tokenizer import ChatTokenizer, StopStringMatcher

Prompt = str | list[int] | list[dict]  # text, token ids, or chat messages (through the chat template)


class TextOut:
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


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


class Sequence:
    """`token_ids` is the prompt followed by the completion so far; positions
    `[0, num_computed_tokens)` have their keys and values in the paged cache.

    `block_table[i]` is the cache block of positions `[i*B, (i+1)*B)`, or -1 once it slid out of
    the window (sparse attention); `node_table[i]` is the node page holding the key nodes elected
    in those positions (sparse only), kept for the whole sequence.

    `speculative_k` (0 = plain decoding) is how many MTP drafts the sequence may verify per
    step; `drafts` holds its drafter (`inference.engine.drafting.SequenceDrafts`), made by the
    model runner and dropped whenever the sequence's cache is (preemption, a failed step).
    `choices` holds the replies it is constrained to (`SamplingParams.choice`), tokenized, or
    the tool-call format it follows (`SamplingParams.tool_call`, `inference.engine.tool_constraint`);
    `scoring` the state its request shares when those replies are scored whole instead
    (`inference.engine.choice_scoring`: the request's own sequence, then one per reply, number
    `choice_index`), which only prefill and sample nothing.
    """

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        text_out: TextOut | None = None,
        generator: torch.Generator | None = None,
        speculative_k: int = 0,
    ) -> None:
        self.request_id = request_id
        self.token_ids = list(prompt_ids)
        self.num_prompt_tokens = len(prompt_ids)
        self.params = params
        self.text_out = text_out or TextOut(None, [])
        self.generator = generator
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (last admission)
        self.block_table: list[int] = []
        self.node_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chained hashes of the full blocks so far
        self.num_slid_out = 0  # leading blocks already released for having left the window
        self.num_keyed_blocks = 0  # leading full blocks registered in the prefix cache
        self.finish_reason: str | None = None
        self.error: Exception | None = None
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.speculative_k = speculative_k
        self.drafts: Any = None
        self.choices: Any = None  # Choices (SamplingParams.choice) or ToolCallConstraint (.tool_call)
        self.scoring: Any = None  # inference.engine.choice_scoring.ChoiceScoring
        # positions from here on are computed even when the prefix cache holds them (a reply
        # being scored: its rows' logits are wanted), None: the cache may serve any
        self.compute_from: int | None = None
        self.choice_index = -1

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_completion_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def finish(self, reason: str, error: Exception | None = None) -> None:
        self.status, self.finish_reason, self.error = SequenceStatus.FINISHED, reason, error
