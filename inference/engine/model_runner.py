"""Runs one batch of sequences through the model on the paged KV cache.

The batch is flattened to one row per scheduled token, so every projection and MLP runs once
for the whole batch; only attention goes sequence by sequence. The pools and what attention
does with them belong to the model's cache layout (`inference.layers.caches.layouts`; GQA's with
its sparse window and key nodes is `inference.layers.caches.gqa`): the runner only says, once
per step, where each sequence's positions live (`SequenceSlots`, from its block table) and hands
the pools' view of the step (`cache.step(slots)`, its tables worked out once for all layers) to
the model's forward in place of a `KVCache`; each attention layer calls its `attend`.

Speculative sequences (`Sequence.speculative_k`): before the forward each decoding one drafts
with its MTP heads (`inference.engine.drafting`), its drafts join the batch as extra rows after
its last token, and after the forward its rows are verified: the accepted prefix plus the
model's own next token come back, and `kept` says how many of its positions stay in the cache
(the rest are simply overwritten by the next step; the block manager frees blocks past them).
Plain and speculative sequences, prefill chunks and verifies share the one forward.

A sequence constrained to given replies (`Sequence.choices`) samples among the tokens that
continue one of them, and once one is left its step returns the rest of it at once. A sequence
scoring replies whole (`Sequence.scoring`) samples nothing: the log-probabilities of the rows
it asks for go to its `ChoiceScoring` (`inference.engine.choice_scoring`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine import cuda_graphs
from inference.engine.choices import mask_to_allowed
from inference.engine.drafting import BatchDrafter, SequenceDrafts
from inference.engine.sequence import Sequence
from inference.engine.speculative import MAX_DRAFT, SpeculativeStats
from inference.layers.caches.layouts import cache_layout
from inference.layers.caches.paged_slots import SequenceSlots
from inference.layers.sampler import Sampler


@dataclass
class StepResult:
    """What one step did for one sequence: `kept` positions are in the cache for good, `tokens`
    are its new tokens (none in the middle of a prompt; several after accepted drafts)."""

    kept: int
    tokens: list[int]


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, mtp_positions: int | None = None,
                 enforce_eager: bool = True) -> None:
        """`mtp_positions`: what a speculative sequence's MTP caches are bounded to. Unless
        `enforce_eager`, decode steps replay CUDA graphs where the device and the model allow
        (`capture_graphs`; the last of the pools' `num_blocks` is then their scratch block, and
        `self.num_blocks`, the blocks sequences get, one fewer)."""
        self.model, self.config, self.block_size = model, model.config, block_size
        self.mtp_positions = mtp_positions
        self.device = model.device
        layout = cache_layout(self.config)
        self.graphs_wanted = not enforce_eager and cuda_graphs.wanted(self.device, layout)
        self.num_blocks = num_blocks - 1 if self.graphs_wanted else num_blocks
        self.cache = layout.paged_cache(num_blocks, block_size, model.model.embed_tokens.weight.dtype, self.device)
        self.graphs: cuda_graphs.DecodeGraphs | None = None
        self.sampler = Sampler()
        self.stats = SpeculativeStats(MAX_DRAFT)  # every speculative sequence's rounds
        self.drafter = BatchDrafter(model) if self.config.num_mtp_heads else None

    @torch.inference_mode()
    def capture_graphs(self, max_batch: int, max_model_len: int) -> None:
        """Capture the decode steps of up to `max_batch` sequences (when wanted)."""
        if self.graphs_wanted:
            self.graphs = cuda_graphs.DecodeGraphs(self.model, self.cache, max_batch, max_model_len,
                                                   scratch_block=self.num_blocks)

    @torch.inference_mode()
    def run(self, batch: list[tuple[Sequence, int]]) -> list[StepResult]:
        """Compute the scheduled tokens (for a speculative sequence, its last token and up to
        n - 1 drafts); the result of each sequence, in batch order."""
        ids, positions, plan_batch = [], [], []
        sample_rows, sampling, verifying, starts = [], [], [], []
        scored = []  # (row, sequence, position, token) whose log-probability a scoring wants
        wanted = []
        for seq, n in batch:
            if seq.speculative_k:
                if seq.drafts is None:
                    seq.drafts = SequenceDrafts(self.model, seq, self.sampler, self.mtp_positions)
                if n > 1 and seq.num_computed_tokens == seq.num_tokens - 1:
                    wanted.append((seq, n - 1))
        drafted = self.drafter.draft(wanted) if wanted else {}
        row = 0
        for seq, n in batch:
            c = seq.num_computed_tokens
            drafts, dists = drafted.get(id(seq), ([], []))
            if id(seq) in drafted:
                n = 1 + len(drafts)
            if drafts:
                ids.append(seq.token_ids[c])
                ids.extend(drafts)
                verifying.append((seq, row, drafts, dists))
            else:
                ids.extend(seq.token_ids[c : c + n])
                if seq.scoring is not None:
                    scored += [(row + p - c, seq, p, t) for p, t in seq.scoring.targets(seq, c, n)]
                elif c + n == seq.num_tokens:
                    sample_rows.append(row + n - 1)
                    sampling.append(seq)
            positions.extend(range(c, c + n))
            plan_batch.append((seq, n))
            starts.append(row)
            row += n
        if self.graphs is not None and self.graphs.can_run(batch):
            hidden = self.graphs.run(batch)
        else:
            hidden = self.model(torch.tensor(ids, device=self.device),
                                torch.tensor(positions, device=self.device),
                                self.cache.step(self._slots(plan_batch)))
        results = {id(seq): StepResult(n, []) for seq, n in plan_batch}
        if sampling:
            logits = self.model.compute_logits(hidden[torch.tensor(sample_rows, device=self.device)])
            if any(s.choices for s in sampling):
                logits = mask_to_allowed(logits, [s.choices.allowed(s.completion_token_ids) if s.choices
                                                  else None for s in sampling])
            drawn = self.sampler(logits, [s.params for s in sampling], [s.token_ids for s in sampling],
                                 [s.generator for s in sampling])
            for seq, token in zip(sampling, drawn.tolist(), strict=True):
                results[id(seq)].tokens.append(token)
                if seq.choices:  # one reply left: the rest of it now (it ends with an eos)
                    results[id(seq)].tokens += seq.choices.rest([*seq.completion_token_ids, token])
        if verifying:
            self._verify(hidden, verifying, results)
        if scored:
            rows = torch.tensor([r for r, *_ in scored], device=self.device)
            logprobs = torch.log_softmax(self.model.compute_logits(hidden[rows]).float(), dim=-1)
            tokens = torch.tensor([0 if t is None else t for *_, t in scored], device=self.device)
            picked = logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()  # one host copy
            for (_, seq, position, token), value, row in zip(scored, picked, logprobs, strict=True):
                seq.scoring.record(seq, position, row if token is None else value)
        for (seq, _), start in zip(plan_batch, starts, strict=True):
            if seq.drafts is not None:  # the main model's hidden states of the kept positions
                seq.drafts.drafter.add_verified(hidden[start : start + results[id(seq)].kept])
        return [results[id(seq)] for seq, _ in plan_batch]

    def _slots(self, batch: list[tuple[Sequence, int]]) -> list[SequenceSlots]:
        """Where the positions of each sequence of the step live in the pools (its block table)."""
        return [SequenceSlots(seq, seq.num_computed_tokens, n, torch.tensor(seq.block_table, dtype=torch.long),
                              self.block_size) for seq, n in batch]

    def _verify(self, hidden: torch.Tensor, verifying: list, results: dict[int, StepResult]) -> None:
        """Check the drafts of every speculative sequence: one lm-head call and, for the plain
        greedy ones, one argmax and one host copy for all of them."""
        rows = torch.cat([torch.arange(r, r + len(d) + 1) for _, r, d, _ in verifying]).to(self.device)
        logits = self.model.compute_logits(hidden[rows])
        greedy = [seq.drafts.plain_greedy for seq, *_ in verifying]
        targets = logits.argmax(dim=-1).tolist() if any(greedy) else None
        a = 0
        for (seq, _, drafts, dists), plain in zip(verifying, greedy, strict=True):
            n = len(drafts) + 1
            mine = targets[a : a + n] if plain else None
            accepted, token = seq.drafts.verify(seq, logits[a : a + n], drafts, dists, mine)
            self.stats.count(len(drafts), accepted)
            results[id(seq)] = StepResult(accepted + 1, [*drafts[:accepted], token])
            a += n
