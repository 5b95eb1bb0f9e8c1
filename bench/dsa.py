"""DeepSeek Sparse Attention against dense MLA, one attention layer: `python -m bench.dsa` (~3 min).

GLM-5's attention (`inference/layers/dsa.py`: the lightning indexer picks `index_topk` = 2048
positions a query, attention gathers only their latent rows) against the same layer without the
indexer (`inference/layers/mla.py`, dense causal MLA over every position), same weights, fp32,
scaled down from GLM-5 (64 heads, kv_lora_rank 512, qk_rope 64, qk_nope 192, v 256; indexer
32 x 128) to 8 heads, rank 128, rope 32, nope 64, v 64, indexer 4 x 32 (GLM-5's ratio of a
query's MLA cost per position, H (2r + dr), to its indexer's, 32 x 128: ~17), so that a dense 32k
prefill runs in a minute here:
- prefill of 4k, 16k and 32k tokens from an empty cache (one call; MLA takes its own choice of
  expanded or absorbed form);
- decode of one token against a cache of 16k, 32k and 64k positions (filled with random rows:
  only the layer's reading of them is timed, not how they got there), the whole layer and its
  attention alone (what DSA changes: the indexer and the chosen rows against every row; the
  layer's projections in and out are the same for both);
- the cache bytes a position costs each (DSA adds the indexer's key to MLA's latent row);
- decode at GLM-5's own attention shape (64 heads, latent 512 + 64, indexer 32 x 128) after 32k
  and 64k positions, the whole layer and the attention alone.
Target (issue #22): DSA at least 3x dense MLA at 32k. Each prefill line also prints the ceiling:
the speedup DSA would show if both ran their multiply-adds at one rate (`prefill_multiply_adds`),
and the rate each ran at.
"""

from __future__ import annotations

import functools
import time

import torch

from inference.config import ModelConfig
from inference.layers.caches.dsa import DSALayerCache
from inference.layers.caches.mla import MLALayerCache
from inference.layers.dsa import DSAttention
from inference.layers.mla import MLAttention
from inference.layers.rotary import RotaryEmbedding

SHAPE = dict(
    model_type="glm_moe_dsa", vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=1,
    num_attention_heads=8, num_key_value_heads=8, q_lora_rank=384, kv_lora_rank=128, qk_nope_head_dim=64,
    qk_rope_head_dim=32, v_head_dim=64, moe_intermediate_size=256, n_routed_experts=8, num_experts_per_tok=2,
    index_topk=2048, index_n_heads=4, index_head_dim=32, indexer_types=["full"], first_k_dense_replace=1,
)


# GLM-5's own attention (inference/configs/glm-5.json): 64 heads, q LoRA 2048, latent 512 + rope 64,
# nope 192, v 256, an indexer of 32 heads x 128; decode only (a prefill at this shape would take
# minutes here)
GLM5_SHAPE = dict(SHAPE, hidden_size=6144, num_attention_heads=64, num_key_value_heads=64, q_lora_rank=2048,
                  kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, index_n_heads=32,
                  index_head_dim=128)


def layers(shape: dict = SHAPE) -> tuple[DSAttention, MLAttention, ModelConfig]:
    config = ModelConfig.from_dict(shape)
    torch.manual_seed(0)
    dsa = DSAttention(config, 0).eval()
    with torch.no_grad():
        for name, p in dsa.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif not name.endswith("bias"):
                p.normal_(0, 0.02)
    mla = MLAttention(config).eval()
    mla.load_state_dict({k: v for k, v in dsa.state_dict().items() if not k.startswith("indexer.")})
    return dsa, mla, config


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def prefill(layer, config: ModelConfig, rotary: RotaryEmbedding, n: int) -> float:
    x = torch.randn(n, config.hidden_size)
    rotations = rotary.rotations(torch.arange(n))
    if isinstance(layer, DSAttention):
        cache = DSALayerCache(config.kv_lora_rank + config.qk_rope_head_dim, config.index_head_dim, torch.float32,
                              torch.device("cpu"))
        return timed(lambda: layer(x, rotations, cache))
    cache = MLALayerCache(config.kv_lora_rank + config.qk_rope_head_dim, torch.float32, torch.device("cpu"))
    return timed(lambda: layer(x, rotations, cache))


def prefill_multiply_adds(config: ModelConfig, n: int) -> tuple[float, float]:
    """The multiply-adds an `n`-token prefill needs, DSA's and dense MLA's (each form's least:
    the expanded form's keys and values without padding), so that `mla / dsa` is the speedup
    the two would show at one and the same rate: the ceiling of what kernels can make of DSA
    at this shape, whatever their speed."""
    h, r, dr = config.num_attention_heads, config.kv_lora_rank, config.qk_rope_head_dim
    dn, dv, hidden, ql = config.qk_nope_head_dim, config.v_head_dim, config.hidden_size, config.q_lora_rank
    hi, di, k = config.index_n_heads, config.index_head_dim, config.index_topk
    shared = n * (hidden * ql + ql * h * (dn + dr) + hidden * (r + dr) + h * dv * hidden)
    causal = n * (n + 1) / 2
    mla = shared + n * r * h * (dn + dv) + causal * h * (dn + dr + dv)
    chosen = k * (k + 1) / 2 + max(0, n - k) * k  # a query keeps min(its positions, index_topk)
    scored = causal - k * (k + 1) / 2  # queries with more positions than index_topk score them all
    dsa = (shared + n * (ql * hi * di + hidden * (di + hi))  # the indexer's projections
           + scored * hi * di  # its scores
           + n * h * dn * r + chosen * h * (2 * r + dr) + n * h * r * dv)  # absorbed attention
    return dsa, mla


def filled_cache(layer, config: ModelConfig, n: int, capacity: int):
    """The layer's kind of cache holding `n` random positions (room for `capacity`)."""
    width = config.kv_lora_rank + config.qk_rope_head_dim
    if isinstance(layer, DSAttention):
        cache = DSALayerCache(width, config.index_head_dim, torch.float32, torch.device("cpu"), capacity)
        cache.extend(torch.randn(n, width), torch.randn(n, config.index_head_dim))
    else:
        cache = MLALayerCache(width, torch.float32, torch.device("cpu"), capacity)
        cache.extend(torch.randn(n, width))
    return cache


def decode(layer, config: ModelConfig, rotary: RotaryEmbedding, n: int, repeats: int = 15) -> float:
    """Seconds for one token after `n` cached positions (best of `repeats`)."""
    cache = filled_cache(layer, config, n, n + repeats)
    best = float("inf")
    for i in range(repeats):
        x, rotations = torch.randn(1, config.hidden_size), rotary.rotations(torch.tensor([n + i]))
        best = min(best, timed(lambda x=x, rotations=rotations: layer(x, rotations, cache)))
    return best


def decode_attention(layer, config: ModelConfig, rotary: RotaryEmbedding, n: int, repeats: int = 15) -> float:
    """`decode` without the layer's projections in and out (the same for both): for DSA the
    indexer (its key, its scores, the top-k) and the attention over the chosen rows, for MLA the
    attention over every row (best of `repeats`)."""
    cache = filled_cache(layer, config, n, n + repeats)
    best = float("inf")
    for i in range(repeats):
        x, rotations = torch.randn(1, config.hidden_size), rotary.rotations(torch.tensor([n + i]))
        parts = layer.project(x, rotations)
        best = min(best, timed(functools.partial(attend_one, layer, cache, x, rotations, parts, torch.tensor([n + i]))))
    return best


def attend_one(layer, cache, x: torch.Tensor, rotations: torch.Tensor, parts: tuple, position: torch.Tensor) -> None:
    """One decode row's attention from its projections `parts` (`MLAttention.project`) on."""
    q_nope, q_rope, latents, resid = parts
    if not isinstance(layer, DSAttention):
        layer.attend(q_nope, q_rope, cache.extend(latents))
        return
    (ctx,) = cache.extend(latents, layer.indexer.keys(x, rotations))
    picked = layer.indexer.select(x, resid, rotations, ctx.index_keys, position)
    query = torch.cat((layer.kv_b_proj.absorb(q_nope), q_rope), dim=-1)
    layer.kv_b_proj.values(layer._selected(query, ctx.latents, picked, position, ctx.rows_of(picked)))


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    dsa, mla, config = layers()
    rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta)
    width = config.kv_lora_rank + config.qk_rope_head_dim
    print(f"one attention layer: {config.num_attention_heads} heads, latent {config.kv_lora_rank} + rope "
          f"{config.qk_rope_head_dim}, indexer {config.index_n_heads} x {config.index_head_dim}, "
          f"index_topk {config.index_topk}, fp32")
    print(f"cache per position: MLA {width * 4} B, DSA {(width + config.index_head_dim) * 4} B "
          f"(+{config.index_head_dim * 4} B of indexer key); per-head K/V would be "
          f"{config.num_attention_heads * (config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim) * 4} B")
    with torch.inference_mode():
        prefill(dsa, config, rotary, 512), prefill(mla, config, rotary, 512)  # warm-up
        print(f"\n{'':>8} {'tokens':>7} {'DSA s':>9} {'dense MLA s':>12} {'speedup':>8} {'ceiling':>8}  "
              f"(ceiling: the speedup at one multiply-add rate for both; GMAC/s DSA, MLA)")
        for n in (4096, 16384, 32768):
            t_dsa, t_mla = prefill(dsa, config, rotary, n), prefill(mla, config, rotary, n)
            w_dsa, w_mla = prefill_multiply_adds(config, n)
            print(f"{'prefill':>8} {n:>7} {t_dsa:>9.3f} {t_mla:>12.3f} {t_mla / t_dsa:>7.2f}x {w_mla / w_dsa:>7.2f}x  "
                  f"{w_dsa / t_dsa / 1e9:.0f}, {w_mla / t_mla / 1e9:.0f}")
        for n in (16384, 32768, 65536):
            t_dsa, t_mla = decode(dsa, config, rotary, n), decode(mla, config, rotary, n)
            print(f"{'decode':>8} {n:>7} {t_dsa * 1e3:>7.2f}ms {t_mla * 1e3:>10.2f}ms {t_mla / t_dsa:>7.2f}x")
        print("decode, the attention alone (indexer included; the projections in and out left out):")
        for n in (16384, 32768, 65536):
            t_dsa, t_mla = decode_attention(dsa, config, rotary, n), decode_attention(mla, config, rotary, n)
            print(f"{'attend':>8} {n:>7} {t_dsa * 1e3:>7.2f}ms {t_mla * 1e3:>10.2f}ms {t_mla / t_dsa:>7.2f}x")
        del dsa, mla
        dsa, mla, config = layers(GLM5_SHAPE)
        rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta)
        print(f"\nGLM-5's own attention shape ({config.num_attention_heads} heads, latent {config.kv_lora_rank} + "
              f"rope {config.qk_rope_head_dim}, indexer {config.index_n_heads} x {config.index_head_dim}), decode:")
        for n in (32768, 65536):
            t_dsa, t_mla = decode(dsa, config, rotary, n, 7), decode(mla, config, rotary, n, 7)
            print(f"{'decode':>8} {n:>7} {t_dsa * 1e3:>7.2f}ms {t_mla * 1e3:>10.2f}ms {t_mla / t_dsa:>7.2f}x")
            t_dsa, t_mla = decode_attention(dsa, config, rotary, n, 7), decode_attention(mla, config, rotary, n, 7)
            print(f"{'attend':>8} {n:>7} {t_dsa * 1e3:>7.2f}ms {t_mla * 1e3:>10.2f}ms {t_mla / t_dsa:>7.2f}x")


if __name__ == "__main__":
    main()
