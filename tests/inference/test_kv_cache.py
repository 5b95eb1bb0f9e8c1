"""Every way through the cache gives the numbers of one full forward; memory is W + n/G."""

import pytest
import torch

from inference.config import ModelConfig
from inference.layers.caches.kv_cache import KVCache
from inference.loader import checkpoint_layout
from inference.models import MODELS, cpu_fast_path
from tests.inference.helpers import glm5_config, random_state

N = 83  # crosses five windows of 16 and twenty blocks of 4


def build(**overrides):
    config = ModelConfig.from_dict(glm5_config(**overrides))
    model = MODELS[config.model_type](config)
    state = random_state(config)
    packed = {name: torch.cat([state[p] for p, _ in parts]) for name, parts in checkpoint_layout(model).items()}
    model.load_state_dict(packed, strict=False)
    return cpu_fast_path.install_(model).eval()  # as the loader does on the CPU


def run(model, ids, chunks):
    cache, outs, a = model.new_cache(), [], 0
    for size in chunks:
        outs.append(model(ids[a : a + size], torch.arange(a, a + size), cache))
        a += size
    return model.compute_logits(torch.cat(outs)), cache


MODELS_UNDER_TEST = {
    "glm5-routed": {},
    "glm5-union": {"routed": False},
    "glm4-sparse": {"model_type": "glm4", "num_mtp_heads": 0},
    "glm4-dense": {"model_type": "glm4", "sliding_window": None, "global_interval": None},
}


@pytest.mark.parametrize("overrides", MODELS_UNDER_TEST.values(), ids=MODELS_UNDER_TEST.keys())
@torch.no_grad()
def test_full_equals_decode_equals_chunked(overrides):
    model = build(**overrides)
    ids = torch.randint(0, 128, (N,))
    full, full_cache = run(model, ids, [N])
    decode, _ = run(model, ids, [9] + [1] * (N - 9))
    chunked, chunked_cache = run(model, ids, [30, 7, 1, 45])
    torch.testing.assert_close(decode, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)
    for a, b in zip(full_cache.layers, chunked_cache.layers, strict=True):
        assert a.node_positions == b.node_positions


@torch.no_grad()
def test_mtp_module_is_cache_consistent():
    model = build()
    ids = torch.randint(0, 128, (N + 1,))
    cache = model.new_cache()
    hidden = model(ids[:N], torch.arange(N), cache)
    full = model.compute_logits(model.mtp_forward(0, hidden, ids[1:], torch.arange(N), cache))
    assert full.shape == (N, 128)
    steps, cache = [], model.new_cache()
    for a, b in [(0, 40), *((i, i + 1) for i in range(40, N))]:
        h = model(ids[a:b], torch.arange(a, b), cache)
        steps.append(model.mtp_forward(0, h, ids[a + 1 : b + 1], torch.arange(a, b), cache))
    torch.testing.assert_close(model.compute_logits(torch.cat(steps)), full, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_32k_prompt_keeps_window_plus_nodes():
    config = ModelConfig.from_dict(
        glm5_config(
            hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, sliding_window=512, global_interval=64, num_mtp_heads=0,
        )
    )
    model = MODELS[config.model_type](config).eval()
    n = 32768
    ids = torch.randint(0, 128, (n,))
    cache = KVCache(config, "cpu")
    for a in range(0, n, 8192):
        hidden = model(ids[a : a + 8192], torch.arange(a, a + 8192), cache)
    assert hidden.shape == (8192, 16) and torch.isfinite(hidden).all()
    layer = cache.layers[0]
    assert layer.length == n
    assert layer.num_nodes == n // 64
    assert layer.num_positions == 512 + n // 64
    per_position = 2 * config.num_key_value_heads * config.head_dim * 4  # k and v, fp32
    assert layer.nbytes() <= (512 + n // 64 + 64) * per_position  # not n * per_position


def test_a_cache_made_for_max_positions_never_allocates_past_them():
    from inference.layers.caches.gqa_sequence import LayerCache, cache_slots

    torch.manual_seed(0)
    cache = LayerCache(2, 8, 16, 4, torch.float32, torch.device("cpu"), max_positions=100)
    assert cache_slots(16, 4, 100) == 16 + 25
    for start in range(0, 100, 10):
        cache.extend(torch.randn(2, 10, 8), torch.randn(2, 10, 8), torch.rand(10))
        assert cache.k.shape[1] <= 16 + 25
    assert cache.num_nodes == 25 and cache.k.shape[1] == 16 + 25
    with pytest.raises(ValueError, match="made for 41 slots"):
        cache.extend(torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.rand(4))
