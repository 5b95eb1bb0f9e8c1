"""FCFS continuous batching with chunked prefill and preemption by recompute.

Each step hands out at most `max_num_batched_tokens` token slots: first to the running
sequences, oldest first (one token to each decoding sequence, the next chunk of its prompt to a
prefilling one), then to waiting sequences in arrival order while fewer than `max_num_seqs` run.
A prompt longer than the budget is prefilled in chunks over several steps. A decoding sequence
with a speculative k gets 1 + its drafts (`num_drafts`) in the same step as everyone else, and
keeps only what the model accepts (`advance`). When blocks run out
the newest running sequence is preempted: its blocks are released and it goes back to the front
of the queue, to be recomputed (with prefix caching, mostly from its own still-cached blocks).
"""

from __future__ import annotations

from collections import deque

from inference.engine.block_manager import BlockManager
from inference.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int | None = None) -> None:
        self.block_manager, self.max_model_len = block_manager, max_model_len
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The sequences of the next step and how many of their tokens to compute."""
        budget, batch, preempted = self.max_num_batched_tokens, [], False
        i = 0
        while i < len(self.running) and budget:
            seq = self.running[i]
            wanted = min(seq.num_tokens - seq.num_computed_tokens + self.num_drafts(seq), budget)
            num_new = min(wanted, self.block_manager.max_new_tokens(seq))
            if num_new == 0:  # not one more block: make room by preempting the newest
                preempted = True
                victim = self.running.pop()
                self.preempt(victim)
                continue  # seq itself when it was the newest: then the loop ends
            self.block_manager.allocate(seq, num_new)
            batch.append((seq, num_new))
            budget -= num_new
            i += 1
        while self.waiting and budget and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            self.block_manager.allocate_prefix(seq)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self.running:  # alone, a prompt larger than the free cache goes in chunks
                num_new = min(num_new, self.block_manager.max_new_tokens(seq))
            if not num_new or not self.block_manager.can_allocate(seq, num_new):
                self.block_manager.free(seq)  # FCFS: nobody overtakes the head of the queue
                break
            self.block_manager.allocate(seq, num_new)
            seq.status = SequenceStatus.RUNNING
            self.running.append(self.waiting.popleft())
            batch.append((seq, num_new))
            budget -= num_new
        return batch

    def num_drafts(self, seq: Sequence) -> int:
        """Drafts a decoding sequence verifies this step: its k, but never so many that the
        step could produce tokens past `max_tokens` or `max_model_len`."""
        if not seq.speculative_k or seq.num_computed_tokens != seq.num_tokens - 1:
            return 0
        left = seq.params.max_tokens - seq.num_completion_tokens
        if self.max_model_len is not None:
            left = min(left, self.max_model_len - seq.num_tokens)
        return max(0, min(seq.speculative_k, left - 1))

    def preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.drafts = None  # its MTP caches follow the positions just dropped
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def hand_over(self, seq: Sequence, successors: list[Sequence]) -> None:
        """A running sequence's work goes on in others (a request scoring its choices: the
        prompt, then one sequence per reply): it leaves the batch and its blocks go back (its
        full ones stay in the prefix cache); the successors come first in the queue."""
        self.block_manager.free(seq)
        self.running.remove(seq)
        self.waiting.extendleft(reversed(successors))

    def advance(self, seq: Sequence, num_kept: int) -> None:
        """The step ran: `num_kept` more positions of the sequence are in the cache for good
        (fewer than scheduled when drafts were rejected). Call it once the accepted tokens are
        in `seq.token_ids`: full blocks are keyed by their tokens."""
        seq.num_computed_tokens += num_kept
        self.block_manager.advance(seq)

    def finish(self, seq: Sequence, reason: str, error: Exception | None = None) -> None:
        """Take a sequence out (done, failed or aborted) and release its blocks."""
        seq.finish(reason, error)
        self.block_manager.free(seq)
        for queue in (self.running, self.waiting):
            if seq in queue:
                queue.remove(seq)
