"""The DSA lightning indexer picks the positions transformers' `GlmMoeDsaIndexer` picks, in one
call or chunk by chunk against a growing key cache."""

from types import SimpleNamespace

import pytest
import torch
from transformers import GlmMoeDsaConfig
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import (
    GlmMoeDsaIndexer,
    GlmMoeDsaRotaryEmbedding,
)

from inference.layers.dsa_indexer import Indexer
from inference.layers.rotary import RotaryEmbedding

HIDDEN, Q_LORA, ROPE = 48, 24, 8


def pair(topk: int, seed: int = 0):
    torch.manual_seed(seed)
    hf_config = GlmMoeDsaConfig(hidden_size=HIDDEN, q_lora_rank=Q_LORA, qk_rope_head_dim=ROPE, index_n_heads=8,
                                index_head_dim=16, index_topk=topk, num_hidden_layers=1, num_attention_heads=2,
                                kv_lora_rank=16, qk_nope_head_dim=8, v_head_dim=8)
    hf = GlmMoeDsaIndexer(hf_config, 0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.5)
    ours = Indexer(SimpleNamespace(index_n_heads=8, index_head_dim=16, index_topk=topk, q_lora_rank=Q_LORA,
                                   hidden_size=HIDDEN)).eval()
    ours.load_state_dict(hf.state_dict())
    return hf_config, hf, ours


def hf_select(hf_config, hf, x, q_resid):
    n = x.shape[1]
    cos, sin = GlmMoeDsaRotaryEmbedding(hf_config)(x, torch.arange(n)[None])
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None]
    with torch.no_grad():
        return hf(x, q_resid, (cos, sin), causal, None)[0].long()


@pytest.mark.parametrize("topk", [6, 64])
def test_the_same_positions_as_transformers(topk):
    hf_config, hf, ours = pair(topk)
    n = 40
    x, q_resid = torch.randn(1, n, HIDDEN), torch.randn(1, n, Q_LORA)
    expected = hf_select(hf_config, hf, x, q_resid)
    rotary = RotaryEmbedding(ROPE, hf_config.rope_parameters["rope_theta"])
    positions = torch.arange(n)
    with torch.inference_mode():
        rotations = rotary.rotations(positions)
        keys = ours.keys(x[0], rotations)
        got = ours.select(x[0], q_resid[0], rotations, keys, positions)
    count = min(topk, n)
    assert got.shape == expected.shape == (n, count)
    for t in range(n):
        valid = min(t + 1, count)  # a query's own and earlier positions; the rest are -inf filler
        mine, theirs = got[t].tolist(), expected[t].tolist()
        assert set(mine[:valid]) == set(theirs[:valid]), t
        assert all(p <= t for p in mine[:valid])
    assert topk > n or count < n  # topk 6: a real choice among up to 40 positions


def test_chunks_against_a_growing_key_cache_choose_as_one_call():
    _, _, ours = pair(5, seed=1)
    n = 30
    x, q_resid = torch.randn(n, HIDDEN), torch.randn(n, Q_LORA)
    rotary = RotaryEmbedding(ROPE, 10000.0)
    with torch.inference_mode():
        rotations = rotary.rotations(torch.arange(n))
        whole = ours.select(x, q_resid, rotations, ours.keys(x, rotations), torch.arange(n))
        cache, parts, a = torch.empty(0, 16), [], 0
        for size in (7, 1, 1, 12, 9):
            r, p = rotations[a : a + size], torch.arange(a, a + size)
            cache = torch.cat((cache, ours.keys(x[a : a + size], r)))
            parts.append(ours.select(x[a : a + size], q_resid[a : a + size], r, cache, p))
            a += size
    for t, row in enumerate(torch.cat([p[:, :5] for p in parts])):
        assert set(row[: min(t + 1, 5)].tolist()) == set(whole[t, : min(t + 1, 5)].tolist())
