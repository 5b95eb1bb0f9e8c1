"""MTP drafts for the sequences of a serving-engine step, and the check of what the model says.

Each speculative sequence keeps its own MTP caches (`KVCache(mtp_only=True)`: one `LayerCache`
per MTP head, the last W positions plus key nodes, a few hundred KB on the demo model) instead of
pages in the paged cache: the MTP layers roll back every round (`LayerCache.truncate`), and
drafts run sequence by sequence anyway, so per-sequence caches are the simple correct home. They
are not part of the KV budget. The drafter is `inference.speculative.MTPDrafter`, the very one
the single-request decoder uses, so both paths draft alike; `verify_drafts` decides acceptance
(greedy: the longest prefix equal to the model's argmax; sampling: rejection sampling).

A drafter starts at the first position the engine computes for the sequence (`base`): positions
a prefix-cache hit served have no main-model hidden state here, so MTP attends to fewer
positions there. Drafts may be anything: the main model verifies each, so that changes the
acceptance rate, never the tokens.
"""

from __future__ import annotations

import torch

from inference.engine.sequence import Sequence
from inference.kv_cache import KVCache
from inference.layers.sampler import Sampler
from inference.speculative import MTPDrafter, _Chooser, greedy_accept, verify_drafts


class SequenceDrafts:
    """One sequence's drafter and next-token chooser (its params and private generator)."""

    def __init__(self, model, seq: Sequence, sampler: Sampler) -> None:
        cache = KVCache(model.config, model.device, model.model.embed_tokens.weight.dtype, mtp_only=True)
        self.drafter = MTPDrafter(model, cache, seq.speculative_k, base=seq.num_computed_tokens)
        self.chooser = _Chooser(sampler, seq.params, seq.generator)

    def draft(self, seq: Sequence, k: int) -> tuple[list[int], list[torch.Tensor | None]]:
        """Up to `k` drafts after the sequence's tokens (none until the drafter has a verified
        hidden state to start from). Every MTP depth runs even when fewer drafts are wanted
        (the scheduler's budget, `max_tokens`): a depth that skipped a round would lose the
        inputs its cache needs next round."""
        if not self.drafter.num_pending or k < 1:
            return [], []
        drafts, dists = self.drafter.draft(seq.token_ids, max(k, self.drafter.depths), self.chooser)
        return drafts[:k], dists[:k]

    def verify(self, seq: Sequence, logits: torch.Tensor, drafts: list[int],
               dists: list[torch.Tensor | None], targets: list[int] | None) -> tuple[int, int]:
        """(drafts accepted, the model's token after them); `targets`: the rows' argmax, given
        for plain greedy (worked out for the whole batch at once)."""
        if targets is not None:
            return greedy_accept(drafts, targets)
        return verify_drafts(logits, drafts, dists, seq.token_ids, self.chooser)

    @property
    def plain_greedy(self) -> bool:
        return self.chooser.plain_greedy
