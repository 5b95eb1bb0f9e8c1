"""Runs one batch of sequences through the model on the paged KV cache.

The batch is flattened to one row per scheduled token, so every projection and MLP runs once
for the whole batch; only attention goes sequence by sequence. Per layer, `PagedLayer.attend`
writes the new keys, values and norms into their slots, elects the key nodes of every interval
the step completes (largest norm, earliest on ties, copied into the sequence's node page), then
for each sequence gathers its window and its valid nodes from the pools into the same
`AttentionContext` the single-request `LayerCache` makes and calls the same
`sparse_attention` (SDPA), so both paths give the same numbers. The slot indices are worked
out once per step (`StepPlan`) and shared by all layers, since every layer has the same blocks.

Speculative sequences (`Sequence.speculative_k`): before the forward each decoding one drafts
with its MTP heads (`inference.engine.drafting`), its drafts join the batch as extra rows after
its last token, and after the forward its rows are verified: the accepted prefix plus the
model's own next token come back, and `kept` says how many of its positions stay in the cache
(the rest are simply overwritten by the next step; the block manager frees blocks past them).
Plain and speculative sequences, prefill chunks and verifies share the one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.config import ModelConfig
from inference.engine.drafting import BatchDrafter, SequenceDrafts
from inference.engine.sequence import Sequence
from inference.kv_cache import AttentionContext
from inference.layers.attention import sparse_attention
from inference.layers.sampler import Sampler
from inference.speculative import MAX_DRAFT, SpeculativeStats


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one position block (keys, values, norms when sparse) plus, when sparse, its
    share of node pages (`global_interval` node pages per position block: see `num_node_pages`)."""
    layers, width = config.num_hidden_layers, config.num_key_value_heads * config.head_dim
    kv = 2 * layers * block_size * width * dtype.itemsize
    if not config.sparse:
        return kv
    return kv + layers * block_size * 4 + kv  # norms, and G node pages of B/G nodes = kv again


class PagedKVCache:
    """The pools: per layer, keys/values of `num_blocks * block_size` position slots as
    `[kv_heads, slots, head_dim]` (the `LayerCache` layout) and, when sparse, the norms of those
    slots and `num_node_pages * block_size / G` node slots."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        layers, heads, dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        slots = num_blocks * block_size
        self.num_blocks, self.block_size = num_blocks, block_size
        self.k = torch.zeros(layers, heads, slots, dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.num_node_pages = num_blocks * config.global_interval if config.sparse else 0
        if config.sparse:
            self.page_size = block_size // config.global_interval
            node_slots = self.num_node_pages * self.page_size
            self.norms = torch.zeros(layers, slots, device=device)
            self.node_k = torch.zeros(layers, heads, node_slots, dim, dtype=dtype, device=device)
            self.node_v = torch.zeros_like(self.node_k)


@dataclass
class SeqPlan:
    start: int  # first position computed this step
    num_new: int
    local_slots: torch.Tensor  # slots of the local keys, in position order
    local_start: int | None  # None: one query, the context is exactly its window
    node_slots: torch.Tensor | None  # node slots of the nodes valid for its last query


class StepPlan:
    """Slot indices of one step, shared by every layer."""

    def __init__(self, batch: list[tuple[Sequence, int]], config: ModelConfig, block_size: int,
                 device: torch.device) -> None:
        window, interval = config.sliding_window, config.global_interval
        write, elect, targets, self.seqs = [], [], [], []
        for seq, n in batch:
            c = seq.num_computed_tokens
            table = torch.tensor(seq.block_table, dtype=torch.long)

            def slots(a: int, b: int, table=table) -> torch.Tensor:
                p = torch.arange(a, b)
                return table[p // block_size] * block_size + p % block_size

            write.append(slots(c, c + n))
            lo = 0 if window is None else max(0, c - window + 1)  # the window of position c
            nodes = None
            if window is not None:
                pages = torch.tensor(seq.node_table, dtype=torch.long)
                per_page = block_size // interval

                def node_slots(a: int, b: int, pages=pages, per_page=per_page) -> torch.Tensor:
                    j = torch.arange(a, b)
                    return pages[j // per_page] * per_page + j % per_page

                first, end = c // interval, (c + n) // interval  # intervals this step completes
                if end > first:
                    elect.append(slots(first * interval, end * interval).view(-1, interval))
                    targets.append(node_slots(first, end))
                nodes = node_slots(0, max(0, c + n - window) // interval)  # valid for position c+n-1
            local_start = None if n == 1 and window is not None else lo
            self.seqs.append(SeqPlan(c, n, slots(lo, c + n).to(device), local_start,
                                     None if nodes is None else nodes.to(device)))
        self.write_slots = torch.cat(write).to(device)
        self.elect_slots = torch.cat(elect).to(device) if elect else None
        self.node_targets = torch.cat(targets).to(device) if targets else None


class PagedLayer:
    """What one attention layer sees of the batch (`Attention.forward` calls `attend`)."""

    def __init__(self, cache: PagedKVCache, layer: int, plan: StepPlan, config: ModelConfig) -> None:
        self.cache, self.layer, self.plan = cache, layer, plan
        self.window, self.interval = config.sliding_window, config.global_interval

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, norms: torch.Tensor | None,
               gate: torch.Tensor | None) -> torch.Tensor:
        """`q [Hq, T, D]`, `k`/`v [Hkv, T, D]`, `norms [T]`, `gate [T, 2]` for the T tokens of
        the step, sequence after sequence; returns `[Hq, T, D]`."""
        plan, layer = self.plan, self.layer
        pool_k, pool_v = self.cache.k[layer], self.cache.v[layer]
        pool_k[:, plan.write_slots] = k
        pool_v[:, plan.write_slots] = v
        if self.window is not None:
            self.cache.norms[layer, plan.write_slots] = norms.float()
            if plan.elect_slots is not None:
                # argmax returns the first maximal index: ties go to the earliest position
                best = self.cache.norms[layer][plan.elect_slots].argmax(dim=1, keepdim=True)
                chosen = plan.elect_slots.gather(1, best)[:, 0]
                self.cache.node_k[layer][:, plan.node_targets] = pool_k[:, chosen]
                self.cache.node_v[layer][:, plan.node_targets] = pool_v[:, chosen]
        outs, a = [], 0
        for sp in plan.seqs:
            keys, values = pool_k[:, sp.local_slots], pool_v[:, sp.local_slots]
            num_local = keys.shape[1]
            if sp.node_slots is not None and sp.node_slots.numel():
                keys = torch.cat((keys, self.cache.node_k[layer][:, sp.node_slots]), dim=1)
                values = torch.cat((values, self.cache.node_v[layer][:, sp.node_slots]), dim=1)
            ctx = AttentionContext(keys, values, num_local, sp.local_start, sp.start)
            g = None if gate is None else gate[a : a + sp.num_new]
            outs.append(sparse_attention(q[:, a : a + sp.num_new], ctx, self.window, self.interval, g))
            a += sp.num_new
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


class PagedBatch:
    """Stands in for `KVCache` in the model's forward: one `PagedLayer` per decoder layer."""

    def __init__(self, cache: PagedKVCache, plan: StepPlan, config: ModelConfig) -> None:
        self.layers = [PagedLayer(cache, i, plan, config) for i in range(config.num_hidden_layers)]


@dataclass
class StepResult:
    """What one step did for one sequence: `kept` positions are in the cache for good, `tokens`
    are its new tokens (none in the middle of a prompt; several after accepted drafts)."""

    kept: int
    tokens: list[int]


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, mtp_positions: int | None = None) -> None:
        """`mtp_positions`: what a speculative sequence's MTP caches are bounded to."""
        self.model, self.config, self.block_size = model, model.config, block_size
        self.mtp_positions = mtp_positions
        self.device = model.device
        self.cache = PagedKVCache(self.config, num_blocks, block_size,
                                  model.model.embed_tokens.weight.dtype, self.device)
        self.sampler = Sampler()
        self.stats = SpeculativeStats(MAX_DRAFT)  # every speculative sequence's rounds
        self.drafter = BatchDrafter(model) if self.config.num_mtp_heads else None

    @torch.inference_mode()
    def run(self, batch: list[tuple[Sequence, int]]) -> list[StepResult]:
        """Compute the scheduled tokens (for a speculative sequence, its last token and up to
        n - 1 drafts); the result of each sequence, in batch order."""
        ids, positions, plan_batch = [], [], []
        sample_rows, sampling, verifying, starts = [], [], [], []
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
                if c + n == seq.num_tokens:
                    sample_rows.append(row + n - 1)
                    sampling.append(seq)
            positions.extend(range(c, c + n))
            plan_batch.append((seq, n))
            starts.append(row)
            row += n
        plan = StepPlan(plan_batch, self.config, self.block_size, self.device)
        hidden = self.model(torch.tensor(ids, device=self.device),
                            torch.tensor(positions, device=self.device),
                            PagedBatch(self.cache, plan, self.config))
        results = {id(seq): StepResult(n, []) for seq, n in plan_batch}
        if sampling:
            logits = self.model.compute_logits(hidden[torch.tensor(sample_rows, device=self.device)])
            drawn = self.sampler(logits, [s.params for s in sampling], [s.token_ids for s in sampling],
                                 [s.generator for s in sampling])
            for seq, token in zip(sampling, drawn.tolist(), strict=True):
                results[id(seq)].tokens.append(token)
        if verifying:
            self._verify(hidden, verifying, results)
        for (seq, _), start in zip(plan_batch, starts, strict=True):
            if seq.drafts is not None:  # the main model's hidden states of the kept positions
                seq.drafts.drafter.add_verified(hidden[start : start + results[id(seq)].kept])
        return [results[id(seq)] for seq, _ in plan_batch]

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
