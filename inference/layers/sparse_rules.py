"""The sparse-attention arithmetic (the contract in inference/layers/attention.py), in one place.

Window W, block size G: a query at position t sees the local keys from `window_start(t, W)` to t
and the key node of every complete block fully left of that window (`nodes_seen`). Every cache
(the single-sequence `LayerCache`, the paged GQA pools, the block manager freeing blocks that
slid out) and the attention's masks ask these functions, so they cannot drift apart.
"""

from __future__ import annotations

import torch


def window_start(position: int, window: int) -> int:
    """The first position in the window of a query at `position`."""
    return max(0, position - window + 1)


def nodes_seen(position: int, window: int, interval: int) -> int:
    """How many key nodes a query at `position` sees: the blocks that end before its window
    starts (nodes 0 .. n-1, node j being that of block j)."""
    return max(0, position - window + 1) // interval


def nodes_seen_from(start: int, count: int, window: int, interval: int) -> tuple[int, ...]:
    """`nodes_seen` of the `count` queries at `start ...`, in one call (a speculative verify asks
    this per layer and step)."""
    return tuple(max(0, p - window + 1) // interval for p in range(start, start + count))


def nodes_seen_by(positions: torch.Tensor, window: int, interval: int) -> torch.Tensor:
    """`nodes_seen` of every query in `positions` (a tensor)."""
    return (positions - window + 1).clamp(min=0) // interval


def blocks_completed(start: int, count: int, interval: int) -> range:
    """The blocks whose last position is among `[start, start + count)`: the ones whose node
    these positions elect (a block's node is elected once, the moment it completes)."""
    return range(start // interval, (start + count) // interval)


def elect(norms: torch.Tensor) -> torch.Tensor:
    """The offset of each block's node in `norms [..., G]` (the blocks' layer-input norms): the
    largest norm; argmax returns the first maximal index, so ties go to the earliest position."""
    return norms.argmax(dim=-1)
