"""MTP drafts for the sequences of a serving-engine step, and the check of what the model says.

Each speculative sequence keeps its own MTP caches (`KVCache(mtp_only=True)`: one `LayerCache`
per MTP head, the last W positions plus key nodes, a few hundred KB on the demo model) instead of
pages in the paged cache: the MTP layers roll back every round (`LayerCache.truncate`), and
drafts run sequence by sequence anyway, so per-sequence caches are the simple correct home. They
sit outside the paged cache, each bounded by the engine's `mtp_positions` (so their bytes are
known: a budget the engine works out sets `LLMEngine.mtp_cache_bytes` aside). The drafter is
`inference.engine.speculative.MTPDrafter`; `verify_drafts` decides acceptance
(greedy: the longest prefix equal to the model's argmax; sampling: rejection sampling).

`BatchDrafter` drafts for all decoding sequences of a step at once: per MTP depth one forward
over every sequence's rows (each sequence's attention against its own cache: the cache layout's
`joined_layer_caches`)
and one lm-head call, so a batch of 8 pays for the linears once, not 8 times. It runs exactly the
steps `MTPDrafter.draft` runs for each sequence alone (same inputs, same cache rollback), only
side by side; a sequence right after the prefill of a prompt longer than the window drafts alone
(its first draft runs MTP over the prompt in window-sized pieces).

A drafter starts at the first position the engine computes for the sequence (`base`): positions
a prefix-cache hit served have no main-model hidden state here, so MTP attends to fewer
positions there. Drafts may be anything: the main model verifies each, so that changes the
acceptance rate, never the tokens.
"""

from __future__ import annotations

import torch

from inference.engine.sequence import Sequence
from inference.engine.speculative import (
    Chooser,
    MTPDrafter,
    draft_modules,
    greedy_accept,
    verify_drafts,
)
from inference.layers.caches.kv_cache import KVCache
from inference.layers.caches.layouts import cache_layout
from inference.layers.sampler import Sampler


class SequenceDrafts:
    """One sequence's drafter and next-token chooser (its params and private generator)."""

    def __init__(self, model, seq: Sequence, sampler: Sampler, max_positions: int | None = None) -> None:
        cache = KVCache(model.config, model.device, model.model.embed_tokens.weight.dtype, mtp_only=True,
                        max_positions=max_positions)
        self.drafter = MTPDrafter(model, cache, seq.speculative_k, base=seq.num_computed_tokens)
        self.chooser = Chooser(sampler, seq.params, seq.generator)

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


# Above this many rows a draft forward runs the model's own fp32 MTP modules and lm head, not the
# int8 copies: `aten._weight_int8pack_mm` is fastest for a handful of rows (what one sequence
# drafts) and falls far behind fp32 beyond (measured on this CPU, a 256 x 1280 weight: 4 rows
# 24 us int8 against 19 us fp32, 40 rows 207 against 103 us; one sequence alone drafts ~5 rows a
# depth, where int8 and fp32 came out even in a whole generation).
INT8_DRAFT_ROWS = 8


class _Job:
    """One sequence's draft in progress."""

    def __init__(self, seq: Sequence, k: int) -> None:
        self.seq, self.state = seq, seq.drafts
        self.drafter: MTPDrafter = seq.drafts.drafter
        self.want = k  # the drafts the step uses
        self.k = max(k, self.drafter.depths)  # every depth runs (see `SequenceDrafts.draft`)
        self.m = seq.num_tokens - 1 - self.drafter.base  # verified rows of the MTP caches' frame
        self.drafts: list[int] = []
        self.dists: list[torch.Tensor | None] = []
        self.out: torch.Tensor | None = None


class BatchDrafter:
    """Drafts for the decoding speculative sequences of one step, batched per MTP depth."""

    def __init__(self, model) -> None:
        self.model, self.layout = model, cache_layout(model.config)
        self.first, self.heads = model.config.num_hidden_layers, model.config.num_mtp_heads

    def draft(self, wanted: list[tuple[Sequence, int]]) -> dict[int, tuple[list[int], list]]:
        """`(seq, k)` pairs (each with its `SequenceDrafts`); returns id(seq) -> (drafts, dists)."""
        result, jobs = {}, []
        for seq, k in wanted:
            drafter = seq.drafts.drafter
            # alone: nothing to start from yet, or a prompt longer than the window (its first
            # draft runs MTP over it in window-sized pieces, so that the caches can roll back)
            if k < 1 or not drafter.num_pending or drafter.num_pending + self.heads > drafter.window:
                result[id(seq)] = seq.drafts.draft(seq, k)
            else:
                jobs.append(_Job(seq, k))
        if jobs:
            self.modules = draft_modules(self.model)
            self._draft(jobs)
            for job in jobs:
                result[id(job.seq)] = (job.drafts[: job.want], job.dists[: job.want])
        return result

    def _draft(self, jobs: list[_Job]) -> None:
        """`MTPDrafter.draft` for every job, one depth at a time."""
        for d in range(self.heads):
            active = [j for j in jobs if d < min(j.k, j.drafter.depths)]
            if not active:
                return
            inputs, ids, positions, layers, lengths = [], [], [], [], []
            for j in active:
                layer = j.drafter.cache.layers[self.first + d]
                start, pending = layer.length, j.drafter.pending[d]
                rows = pending if d == 0 else j.out if pending.shape[0] == 0 else torch.cat((pending, j.out))
                assert rows.shape[0] == j.m - start, "MTP caches out of step"
                j.start, j.inputs, j.layer = start, rows, layer
                base = j.drafter.base
                ids += j.seq.token_ids[base + start + d + 1 :] + j.drafts[max(0, start + d - j.m) :]
                positions += range(base + start, base + j.m)
                inputs.append(rows)
                layers.append(layer)
                lengths.append(rows.shape[0])
            out = self._forward(d, torch.cat(inputs), ids, positions, layers, lengths)
            a = 0
            for j, n in zip(active, lengths, strict=True):
                j.out, a = out[a : a + n], a + n
            self._choose(active, torch.stack([j.out[-1] for j in active]))
            if d == self.heads - 1:  # past the last head: it runs on autoregressively
                hidden = {id(j): j.out[-1:] for j in active}
                while more := [j for j in active if len(j.drafts) < j.k]:
                    rows = [hidden[id(j)] for j in more]
                    out = self._forward(d, torch.cat(rows), [j.drafts[-1] for j in more],
                                        [j.drafter.base + j.layer.length for j in more],
                                        [j.layer for j in more], [1] * len(more))
                    for i, j in enumerate(more):
                        hidden[id(j)] = out[i : i + 1]
                    self._choose(more, out)
            for j in active:  # keep only positions whose inputs are verified: j <= m - d - 1
                j.layer.truncate(j.m - d)
                keep = j.m - d - j.start
                j.drafter.pending[d] = j.inputs[keep : keep + (1 if d else 0)]

    def _forward(self, d: int, hidden: torch.Tensor, ids: list[int], positions, layers, lengths) -> torch.Tensor:
        device = self.model.device
        module = self.modules.mtp[d] if len(ids) <= INT8_DRAFT_ROWS else None  # None: the fp32 one
        return self.model.mtp_forward(d, hidden, torch.tensor(ids, device=device),
                                      torch.tensor(list(positions), device=device), None, module,
                                      self.layout.joined_layer_caches(layers, lengths))

    def _choose(self, jobs: list[_Job], hidden: torch.Tensor) -> None:
        """Each job's next draft from its row of `hidden`: one lm-head call, one argmax for the
        plain greedy ones."""
        if hidden.shape[0] <= INT8_DRAFT_ROWS:
            logits = self.modules.logits(hidden)
        else:
            logits = self.model.compute_logits(hidden)
        greedy = [j.state.plain_greedy for j in jobs]
        top = logits.argmax(dim=-1).tolist() if any(greedy) else None
        for i, (j, plain) in enumerate(zip(jobs, greedy, strict=True)):
            if plain:
                choice, dist = top[i], None
            else:
                choice, dist = j.state.chooser.choose(logits[i : i + 1], j.seq.token_ids + j.drafts)
            j.drafts.append(choice)
            j.dists.append(dist)
