"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket (as vLLM does).

An eager decode step launches a few hundred small kernels from Python (projections, norms,
rotary, one attention launch a layer, the MoE's grouped launches); at small batches a GPU waits
on the launches, not on memory. A graph captures the whole forward once and replays it in one
launch. It replays exactly the kernels and pointers it captured, so everything a step changes
lives in static device buffers the runner fills before each replay: the token ids, their
positions, each row's block table and context length. Inside the graph the slot each row writes
comes from its table and position, and the attention kernels read the rows' positions through
their tables (inference/layers/kernels/paged_decode_triton.py, `page`), so the host copies the block
tables a step, never a slot list.

Steps replayed: decode only (every sequence one new token that is sampled; no prefill, chunk,
speculative draft or verify, no scoring), up to `max_num_seqs` sequences, padded to the next
bucket (1, 2, 4, then multiples of 8): a padded row reads and writes one scratch slot that no
sequence owns (the runner's pools hold one block more than the block manager hands out). Which
models: those whose decode step has no data-dependent shape, GQA without a sparse window
(GLM-4, GLM-4.5's MoE) and MLA (GLM-4.7-Flash), MoE experts included; `glm5_sparse` (a step elects key nodes
where intervals end) and DSA (the indexer's top-k) decode eagerly. Logits and sampling run after
the replay, on the device, with one host copy of the sampled tokens.

`MODE` (`INFERENCE_CUDA_GRAPHS`): "auto" captures on CUDA when the attention kernels are taken;
"0" never; "emulate" runs the same static-buffer steps on the CPU without a graph (tests, under
Triton's interpreter): each replay calls the captured function again on the static buffers, with
reads of a tensor's value on the host refused, as a capture refuses them.
"""

from __future__ import annotations

import contextlib
import os

import torch

from inference.layers.caches.gqa import GQALayout, GQAStep
from inference.layers.caches.mla import MLALayout, MLAStep
from inference.layers.kernels import paged_decode_triton

MODE = os.environ.get("INFERENCE_CUDA_GRAPHS", "auto")


def buckets(max_batch: int) -> list[int]:
    """The batch sizes captured: 1, 2, 4, then every multiple of 8, up to `max_batch`."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8))
    return [*sizes, max_batch]


def static_step(layout):
    """How a decode step on a layout's pools is built from device tensors alone (its
    `decode_only`), or None where the layout's decode has a data-dependent shape."""
    if type(layout) is GQALayout and layout.window is None:
        return GQAStep.decode_only
    if type(layout) is MLALayout:
        return MLAStep.decode_only
    return None


def wanted(device: torch.device, layout) -> bool:
    """Whether decode steps on `layout`'s pools are replayed from graphs (on this device, in
    this mode)."""
    if MODE == "0" or static_step(layout) is None or not paged_decode_triton.wanted(device):
        return False
    return device.type == "cuda" if MODE == "auto" else MODE == "emulate"


class DecodeGraphs:
    """The captured decode steps of one model on one runner's pools."""

    def __init__(self, model, cache, max_batch: int, max_model_len: int, scratch_block: int) -> None:
        device, bs = model.device, cache.block_size
        self.model, self.cache, self.block_size = model, cache, bs
        self.scratch_block = scratch_block
        self.max_blocks = -(-(max_model_len + 1) // bs)  # a sequence's longest block table
        self.ids = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.lengths = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.tables = torch.full((max_batch, self.max_blocks), scratch_block, dtype=torch.long, device=device)
        self.build_step = static_step(cache.layout)
        self.replays = 0  # (tests: how many steps were replayed)
        pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graphs = {b: _capture(self._forward_fn(b), pool) for b in sorted(buckets(max_batch), reverse=True)}

    def _forward_fn(self, b: int):
        """The first `b` rows of the static buffers through the model: what a graph holds."""
        def forward() -> torch.Tensor:
            tables, positions, bs = self.tables[:b], self.positions[:b], self.block_size
            write = tables.gather(1, (positions // bs)[:, None])[:, 0] * bs + positions % bs
            step = self.build_step(self.cache, write, tables, self.lengths[:b])
            return self.model(self.ids[:b], positions, step)
        return forward

    def can_run(self, batch) -> bool:
        """Whether a step of `(sequence, tokens)` fits a graph: decode rows only, every one
        sampled, none drafting or scoring, block tables within the captured width."""
        return len(batch) <= max(self.graphs) and all(
            n == 1 and seq.num_computed_tokens == seq.num_tokens - 1 and not seq.speculative_k
            and seq.scoring is None and len(seq.block_table) <= self.max_blocks for seq, n in batch)

    def run(self, batch) -> torch.Tensor:
        """The hidden states `[len(batch), hidden]` of a decode step (rows in batch order),
        from the smallest graph that holds it; valid until the next replay."""
        n = len(batch)
        b = min(size for size in self.graphs if size >= n)
        width = max(len(seq.block_table) for seq, _ in batch)
        tables = [[*seq.block_table, *[self.scratch_block] * (width - len(seq.block_table))] for seq, _ in batch]
        tables += [[self.scratch_block] * width] * (b - n)
        positions = [seq.num_computed_tokens for seq, _ in batch] + [0] * (b - n)
        host = torch.tensor([[seq.token_ids[-1] for seq, _ in batch] + [0] * (b - n), positions,
                             [p + 1 for p in positions]])
        self.ids[:b].copy_(host[0], non_blocking=True)
        self.positions[:b].copy_(host[1], non_blocking=True)
        self.lengths[:b].copy_(host[2], non_blocking=True)
        self.tables[:b, :width].copy_(torch.tensor(tables), non_blocking=True)
        self.replays += 1
        return self.graphs[b].replay()[:n]


class _CudaGraph:
    """One captured forward (warmed up on a side stream first: Triton compiles, lazy state is
    made, as torch's CUDA graph notes ask)."""

    def __init__(self, fn, pool) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn()

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


class _Rerun:
    """Off CUDA ("emulate"): the captured function run again at each replay, on the same static
    buffers, refusing what a capture refuses (a tensor's value read on the host)."""

    def __init__(self, fn, pool) -> None:
        self.fn = fn
        with no_host_reads():
            fn()

    def replay(self) -> torch.Tensor:
        with no_host_reads():
            return self.fn()


def _capture(fn, pool):
    return _CudaGraph(fn, pool) if torch.cuda.is_available() and pool is not None else _Rerun(fn, pool)


class HostReadInGraph(RuntimeError):
    """A decode step read a tensor's value on the host: a CUDA graph cannot capture it."""


@contextlib.contextmanager
def no_host_reads():
    """Refuse `item`, `tolist` and a tensor's truth or number value while the block runs (the
    host syncs a graph capture fails on)."""
    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
    saved = {name: getattr(torch.Tensor, name) for name in names}

    def refuse(name):
        def refused(self, *args, **kwargs):
            raise HostReadInGraph(f"Tensor.{name} in a step replayed from a CUDA graph")
        return refused

    for name in names:
        setattr(torch.Tensor, name, refuse(name))
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
