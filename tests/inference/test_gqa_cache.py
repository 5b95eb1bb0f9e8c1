"""The GQA cache layout's byte counts are what its caches allocate: the engine divides its
budget by them, so a count that drifted from the tensors would over- or under-fill the memory."""

import pytest
import torch

from inference.config import ModelConfig
from inference.layers.caches.gqa import GQALayout
from inference.layers.caches.layouts import cache_layout
from tests.inference.helpers import glm5_config

DENSE = {"model_type": "glm4", "sliding_window": None, "global_interval": None}
CONFIGS = {"dense": DENSE, "sparse": {}}  # sparse: W=16, G=4


def layout_for(kind: str) -> GQALayout:
    return cache_layout(ModelConfig.from_dict(glm5_config(**CONFIGS[kind])))


def allocated(obj) -> int:
    return sum(t.nbytes for t in vars(obj).values() if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("kind", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 64])
def test_a_paged_pool_takes_the_bytes_per_block_it_reports(kind, dtype, block_size):
    layout, num_blocks = layout_for(kind), 5
    pool = layout.paged_cache(num_blocks, block_size, dtype, torch.device("cpu"))
    assert allocated(pool) == num_blocks * layout.bytes_per_block(block_size, dtype)
    assert layout.bytes_per_block(block_size, dtype) == block_size * layout.bytes_per_token(dtype)
    assert pool.num_node_pages == (0 if kind == "dense" else num_blocks * 4)


@pytest.mark.parametrize(("kind", "positions"), [("dense", 300), ("sparse", 400)])
def test_layer_cache_bytes_is_what_a_full_layer_cache_allocates(kind, positions):
    """Filled past its first allocation (256 slots dense, W + 64 sparse), so it has grown."""
    layout, dtype = layout_for(kind), torch.float32
    cache = layout.layer_cache(dtype, torch.device("cpu"), max_positions=positions)
    g = torch.Generator().manual_seed(0)
    for a in range(0, positions, 7):  # chunks, so that nodes are elected along the way
        n = min(7, positions - a)
        k, v = (torch.randn(2, n, 8, generator=g) for _ in range(2))
        cache.extend(k, v, torch.rand(n, generator=g) if kind == "sparse" else None)
    assert cache.length == positions
    assert allocated(cache) == layout.layer_cache_bytes(dtype, positions)


def test_every_model_type_gets_the_gqa_layout_by_default():
    for raw in (glm5_config(), glm5_config(**DENSE)):
        assert type(cache_layout(ModelConfig.from_dict(raw))) is GQALayout
