"""Which cache a model's attention keeps, and what the engine asks of it.

Each attention kind owns its cache layout: what it keeps per position (GQA: keys and values;
MLA: a compressed latent; DSA: also its indexer's keys), for one sequence and in the serving
engine's paged pools, and what that costs. One sequence's caches (`KVCache`) and the engine
(`LLMEngine` sizes the pools, `ModelRunner` builds only the position slot tables) never look
inside: they ask the model's `cache_layout`. A new kind is one module with a `CacheLayout` (see
gqa.py, mla.py), named in `LAYOUTS` under its `model_type`; every other model gets
`GQALayout`, which needs only `num_key_value_heads`, `head_dim`, `sliding_window` and
`global_interval`. What a layer's attention calls on its cache is between the two of them (GQA:
`extend(k, v, norms)` on one sequence, `attend(q, k, v, norms, gate)` on a paged step; MLA:
`extend(latent_rows)` on both); the engine only passes the caches through.
"""

from __future__ import annotations

from typing import Protocol

import torch

from inference.config import ModelConfig
from inference.layers.caches.dsa import DSALayout
from inference.layers.caches.gqa import GQALayout
from inference.layers.caches.hybrid import HybridLayout
from inference.layers.caches.mla import MLALayout
from inference.layers.caches.paged_slots import SequenceSlots


class PagedStep(Protocol):
    """The paged pools as one step's batch sees them: `layers[i]` is what layer i's attention
    gets in place of its one-sequence cache (GQA: `attend(q, k, v, norms, gate)` writes the new
    rows and returns their attention output, as `Attention.forward` calls it)."""

    layers: list


class PagedCache(Protocol):
    num_node_pages: int  # the block manager's second pool (0: none), see `CacheLayout.node_pages`

    def step(self, rows: list[SequenceSlots]) -> PagedStep:
        """The view of one step: the slots its layers write and read (worked out once, from
        each sequence's `SequenceSlots`), and any tables beyond them (sparse: node pages)."""


class CacheLayout(Protocol):
    """Built from the model's config; answers for its decoder layers."""

    def layer_cache(self, dtype: torch.dtype, device: torch.device, max_positions: int | None = None):
        """One layer of one sequence, contiguous: `extend(...)` appends the new positions and
        returns the context their queries attend to; `truncate(length)`, `nbytes()`, `length`.
        `max_positions` bounds it."""

    def layer_cache_bytes(self, dtype: torch.dtype, positions: int) -> int:
        """The most a `layer_cache(..., max_positions=positions)` allocates."""

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """The paged pools' bytes per position slot, all layers, side pages' share included."""

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        """The paged pools' bytes per position block: what the engine divides its budget by."""

    def node_pages(self, num_blocks: int) -> int:
        """Pages of the block manager's second pool (one per position block of a sequence, kept
        for its whole length) beside `num_blocks` position blocks; 0: the layout has none."""

    def longest_sequence(self, num_blocks: int, block_size: int) -> int:
        """The longest sequence pools of `num_blocks` blocks hold on their own."""

    def paged_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype,
                    device: torch.device) -> PagedCache:
        """Allocate the pools."""

    def joined_layer_caches(self, caches: list, lengths: list[int]):
        """One layer of several sequences, each in its own `layer_cache`, as one batch, their
        rows one after another (batched MTP drafts); it answers what a paged step's layer does."""


# model_type -> layout, where it is not GQA
LAYOUTS: dict[str, type[CacheLayout]] = {"glm4_moe_lite": MLALayout, "glm_moe_dsa": DSALayout, "glm5_next": HybridLayout}


def cache_layout(config: ModelConfig) -> CacheLayout:
    return LAYOUTS.get(config.model_type, GQALayout)(config)
