"""Where positions live in the paged pools: the slot tables of one engine step.

A pool holds `num_blocks * block_size` slots; a sequence's block table names its blocks, so its
position p sits in slot `table[p // block_size] * block_size + p % block_size` (`page_slots`;
any other per-sequence page table, such as the sparse layout's node pages, maps the same way).
The model runner makes one `SequenceSlots` per sequence of a step, whatever the cache layout;
the layout's pools work out from them, once per step, the slots their layers write and read
(inference/layers/caches/layouts.py): only the layout knows which positions those are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from inference.engine.sequence import Sequence


def page_slots(table: torch.Tensor, page_size: int, start: int, end: int) -> torch.Tensor:
    """The slots of entries `[start, end)` of a sequence whose pages of `page_size` are `table`."""
    i = torch.arange(start, end)
    return table[i // page_size] * page_size + i % page_size


@dataclass
class SequenceSlots:
    """One sequence of a step: it computes positions `[start, start + num_new)`; `slots(a, b)`
    says where any of its positions live. `seq` carries the other page tables a layout keeps."""

    seq: Sequence
    start: int
    num_new: int
    table: torch.Tensor  # its block table (on the host)
    block_size: int

    def slots(self, a: int, b: int) -> torch.Tensor:
        return page_slots(self.table, self.block_size, a, b)
