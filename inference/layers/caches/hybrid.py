"""The cache of GLM-5.3-Flash (`glm5_next`), a hybrid of two kinds of layer: a KDA layer keeps a
fixed-size recurrent state per sequence (inference/layers/kda.py, `KDAState`: the same bytes at
4k or 1M positions), a sparse layer keeps per position a latent row (`kv_lora_rank`, no rotary
part) and, where it runs its own indexer, `2 x index_head_dim` pool-key inputs
(inference/layers/pooled_dsa.py), in DSA's caches (inference/layers/caches/dsa.py).

- `HybridCache`: one sequence (the single-request path, `model.new_cache()`).
- `HybridLayout` / `PagedHybridCache`: the serving engine's. The sparse layers' rows live in DSA's
  paged pools (block tables, preemption as every layout); the KDA states of the running sequences
  live beside them, one set a sequence, made when it computes its first position (a fresh start,
  or a preempted one recomputed from the start) and dropped when it finishes. A state holds the
  whole prefix in one summary, so a block of positions cannot be shared between sequences: the
  layout refuses prefix caching (`supports_prefix_caching`; the engine turns it off and says so).
"""

from __future__ import annotations

import weakref

import torch

from inference.config import ModelConfig
from inference.layers.caches.dsa import DSALayerCache, IndexedContext
from inference.layers.caches.paged_slots import SequenceSlots
from inference.layers.kda import KDAState, state_bytes


class KDARows:
    """What a KDA layer gets from its cache: the sequences' states and their rows' counts."""

    def __init__(self, states: list[KDAState], lengths: list[int]) -> None:
        self.states, self.lengths = states, lengths


def kda_width(config: ModelConfig) -> tuple[int, int, int, int]:
    return 3 * config.linear_num_heads * config.linear_head_dim, config.linear_conv_kernel_dim, \
        config.linear_num_heads, config.linear_head_dim


class HybridCache:
    """One sequence: `layers[i]` is a `KDAState` (KDA layer) or a `DSALayerCache` (sparse layer)."""

    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        key_width = 2 * config.index_head_dim
        self.layers = [KDAState(*kda_width(config), device) if kind == "linear_attention"
                       else DSALayerCache(config.kv_lora_rank, key_width, dtype, device)
                       for kind in config.layer_types]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)

    def truncate(self, length: int) -> None:
        if length != self.length:
            raise ValueError("a KDA state cannot roll back: glm5_next does not decode speculatively")


def kda_rows(cache, rows: int) -> KDARows:
    """A KDA layer's part of a cache: one sequence's `KDAState`, or a paged step's `KDARows`."""
    return KDARows([cache], [rows]) if isinstance(cache, KDAState) else cache


class HybridLayout:
    """The engine's questions (inference/layers/caches/layouts.py) for glm5_next."""

    supports_prefix_caching = False
    prefix_caching_refused = ("glm5_next: prefix caching is off: a KDA layer's state sums up the whole prefix, so "
                              "blocks of positions cannot be shared between sequences (docs/glm5-next.md)")

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.sparse_layers = [i for i, kind in enumerate(config.layer_types) if kind == "indexed_attention"]
        self.full_layers = [i for i in self.sparse_layers if config.indexer_types[i] == "full"]
        self.width, self.key_width = config.kv_lora_rank, 2 * config.index_head_dim
        self.kda_layers = len(config.layer_types) - len(self.sparse_layers)

    def layer_cache(self, dtype: torch.dtype, device: torch.device, max_positions: int | None = None):
        return DSALayerCache(self.width, self.key_width, dtype, device, max_positions)

    def layer_cache_bytes(self, dtype: torch.dtype, positions: int) -> int:
        return positions * (self.width + self.key_width) * dtype.itemsize

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return (len(self.sparse_layers) * self.width + len(self.full_layers) * self.key_width) * dtype.itemsize

    def bytes_per_sequence(self) -> int:
        """The KDA states of one sequence, all layers (fp32 whatever the model's dtype)."""
        return self.kda_layers * state_bytes(self.config)

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        return block_size * self.bytes_per_token(dtype)

    def node_pages(self, num_blocks: int) -> int:
        return 0

    def longest_sequence(self, num_blocks: int, block_size: int) -> int:
        return num_blocks * block_size

    def paged_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype,
                    device: torch.device) -> PagedHybridCache:
        return PagedHybridCache(self, num_blocks, block_size, dtype, device)

    def joined_layer_caches(self, caches: list, lengths: list[int]):
        raise NotImplementedError("glm5_next has no MTP drafts")


class PagedHybridCache:
    """The sparse layers' latent and key pools, and the running sequences' KDA states."""

    num_node_pages = 0

    def __init__(self, layout: HybridLayout, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.layout, self.device = layout, device
        self.num_blocks, self.block_size = num_blocks, block_size
        self.latents = torch.zeros(len(layout.sparse_layers), num_blocks * block_size, layout.width, dtype=dtype,
                                   device=device)
        self.index_keys = torch.zeros(len(layout.full_layers), num_blocks * block_size, layout.key_width,
                                      dtype=dtype, device=device)
        # id(sequence) -> (a weak reference to it, its KDA states, one a KDA layer)
        self.states: dict[int, tuple[weakref.ref, list[KDAState]]] = {}

    def nbytes(self) -> int:
        pools = (self.latents.numel() + self.index_keys.numel()) * self.latents.element_size()
        return pools + sum(s.nbytes() for _, states in self.states.values() for s in states)

    def states_of(self, row: SequenceSlots) -> list[KDAState]:
        """The sequence's KDA states, fresh (zeros) where it computes from position 0."""
        key = id(row.seq)
        held = self.states.get(key)
        if held is not None and held[0]() is not row.seq:
            held = None  # another sequence now has that id
        if held is None or row.start == 0:
            if row.start != 0:
                raise ValueError(f"a glm5_next sequence resumed at position {row.start} without its KDA states "
                                 "(prefix caching must be off for this model)")
            states = held[1] if held is not None else [KDAState(*kda_width(self.layout.config), self.device)
                                                       for _ in range(self.layout.kda_layers)]
            for state in states:
                state.reset()  # a fresh start or a preempted sequence recomputed from position 0
            self.states[key] = held = (weakref.ref(row.seq), states)
        return held[1]

    def step(self, rows: list[SequenceSlots]) -> HybridStep:
        for key, (seq, _) in list(self.states.items()):
            if seq() is None or seq().is_finished:
                del self.states[key]
        return HybridStep(self, rows)


class SlotPlan:
    """Where a step's rows go in the sparse layers' pools and which slots each sequence reads."""

    def __init__(self, rows: list[SequenceSlots], device: torch.device) -> None:
        self.write_slots = torch.cat([row.slots(row.start, row.start + row.num_new) for row in rows]).to(device)
        self.num_new = [row.num_new for row in rows]
        self.read_slots = [row.slots(0, row.start + row.num_new).to(device) for row in rows]


class HybridStep:
    """One step of the paged cache, in place of a `HybridCache` in the model's forward."""

    def __init__(self, cache: PagedHybridCache, rows: list[SequenceSlots]) -> None:
        plan = SlotPlan(rows, cache.device)
        states = [cache.states_of(row) for row in rows]
        layout, sparse, linear = cache.layout, 0, 0
        self.layers: list = []
        for i, kind in enumerate(layout.config.layer_types):
            if kind == "linear_attention":
                self.layers.append(KDARows([s[linear] for s in states], plan.num_new))
                linear += 1
            else:
                keys = cache.index_keys[layout.full_layers.index(i)] if i in layout.full_layers else None
                self.layers.append(PagedSparseLayer(cache.latents[sparse], keys, plan))
                sparse += 1


class PagedSparseLayer:
    """A sparse layer's view of the step: its latent pool and, in a full layer, its key pool."""

    def __init__(self, pool: torch.Tensor, key_pool: torch.Tensor | None, plan: SlotPlan) -> None:
        self.pool, self.key_pool, self.plan = pool, key_pool, plan

    def extend(self, rows: torch.Tensor, keys: torch.Tensor | None = None) -> list[IndexedContext]:
        plan = self.plan
        self.pool[plan.write_slots] = rows
        if keys is not None:
            self.key_pool[plan.write_slots] = keys
        return [IndexedContext(self.pool, n, None if keys is None else self.key_pool, slots)
                for slots, n in zip(plan.read_slots, plan.num_new, strict=True)]
