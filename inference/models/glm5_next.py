"""Hugging Face `Glm5NextForConditionalGeneration`'s text model (GLM-5.3-Flash) on the engine's
layers, as transformers 5.24's `Glm5NextTextModel` computes it; the vision tower is not loaded
(images go to a vision server, as for every other model here).

Layers (`layer_types`): three in four "linear_attention", Kimi Delta Attention
(inference/layers/kda.py: a fixed-size state a sequence), the fourth "indexed_attention", DSA
over MLA without rotary and with pooled indexer keys (inference/layers/pooled_dsa.py); a "shared"
sparse layer attends to the choice of the full sparse layer just before it. Around each block the
residual is `hc_mult` streams mixed by manifold hyper-connections
(inference/layers/hyper_connection.py); the MLPs are SwiGLU with the gate clamped above and the
up projection both ways at `swiglu_limit`, the dense first layers plain, the others GLM's MoE
(inference/layers/moe.py's router, the experts clamped). The cache is
inference/layers/caches/hybrid.py's.

Weight names, under `model.language_model.` in the published checkpoint (`model.` in a flat
text-only one; `checkpoint_prefix`), N a layer, E an expert:
    embed_tokens.weight, norm.weight; lm_head.weight at the top
    layers.N.hc_{attn,ffn}_fn [(2 + hc) hc, hc * hidden], hc_{attn,ffn}_base [(2 + hc) hc], hc_{attn,ffn}_scale [3]
    layers.N.{input,post_attention}_layernorm.weight
    KDA layers: layers.N.self_attn.{q,k,v}_proj, {q,k,v}_conv1d [heads * dim, 1, kernel], f_a_proj, f_b_proj,
        dt_bias, A_log, b_proj, g_a_proj, g_b_proj, o_norm, o_proj
    sparse layers: layers.N.self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm,
        kv_b_proj, o_proj}, indexer.{wq_b, wk, k_norm (weight, bias), weights_proj, index_kpool_compress_ape,
        index_kpool_compress_gate}
    layers.N.mlp.{gate,up,down}_proj (dense), or mlp.gate.{weight, e_score_correction_bias},
        mlp.experts.E.{gate,up,down}_proj, mlp.shared_experts.{gate,up,down}_proj
The MTP layer (`layers.{num_hidden_layers}`) and the vision tower (`model.visual.`) are skipped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.config import ModelConfig
from inference.layers.caches.hybrid import HybridCache, kda_rows
from inference.layers.hyper_connection import merge, mix_weights
from inference.layers.kda import KDAttention
from inference.layers.linear import Linear
from inference.layers.moe import MoE, SwiGLU
from inference.layers.norm import RMSNorm
from inference.layers.pooled_dsa import PooledDSAttention
from inference.models.glm4_moe import sparse_mlp


class ClampedSwiGLU(SwiGLU):
    """`down(silu(min(gate, limit)) * clamp(up, -limit, limit))`."""

    def __init__(self, hidden: int, intermediate: int, limit: float | None) -> None:
        super().__init__(hidden, intermediate)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        if self.limit is not None:
            gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
        return self.down_proj(F.silu(gate) * up)


class ClampedMoE(MoE):
    """GLM's MoE with clamped SwiGLU experts (the CPU fast path's experts kernel is not taken:
    it computes the unclamped ones)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        hidden, size, limit = config.hidden_size, config.moe_intermediate_size, config.swiglu_limit
        self.experts = nn.ModuleList(ClampedSwiGLU(hidden, size, limit) for _ in range(config.n_routed_experts))
        self.shared_experts = ClampedSwiGLU(hidden, size * config.n_shared_experts, limit) \
            if config.n_shared_experts else None


class Glm5NextDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        streams, hidden = config.hc_mult, config.hidden_size
        size = (2 + streams) * streams
        self.hc_attn_fn = nn.Parameter(torch.empty(size, streams * hidden))
        self.hc_attn_base = nn.Parameter(torch.empty(size))
        self.hc_attn_scale = nn.Parameter(torch.empty(3))
        self.hc_ffn_fn = nn.Parameter(torch.empty(size, streams * hidden))
        self.hc_ffn_base = nn.Parameter(torch.empty(size))
        self.hc_ffn_scale = nn.Parameter(torch.empty(3))
        self.hc = (config.hc_sinkhorn_iters, config.hc_eps, config.rms_norm_eps)
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.linear = config.layer_types[index] == "linear_attention"
        self.self_attn = KDAttention(config) if self.linear else \
            PooledDSAttention(config, full=config.indexer_types[index] == "full")
        self.mlp = ClampedMoE(config) if sparse_mlp(config, index) else \
            ClampedSwiGLU(hidden, config.intermediate_size, config.swiglu_limit)

    def forward(self, streams: torch.Tensor, cache, chosen: list[torch.Tensor] | None
                ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """`streams [T, hc_mult, hidden]`; `chosen`: the previous layer's sparse choice (None
        after a KDA layer). Returns the new streams and this layer's choice."""
        post, comb, x = mix_weights(streams, self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale, *self.hc)
        x = self.input_layernorm(x)
        if self.linear:
            rows = kda_rows(cache, x.shape[0])
            out, chosen = self.self_attn(x, rows.states, rows.lengths), None
        else:
            out, chosen = self.self_attn(x, cache, chosen)
        streams = merge(post, comb, out, streams)
        post, comb, x = mix_weights(streams, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale, *self.hc)
        return merge(post, comb, self.mlp(self.post_attention_layernorm(x)), streams), chosen


class Glm5NextModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Glm5NextDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Glm5NextForCausalLM(nn.Module):
    """One sequence a call (`forward(ids [L], positions [L], cache)` continues the cache), or a
    paged step's sequences; the positions only say where: no layer has a rotary."""

    # kept fp32 whatever the dtype, as transformers' `_keep_in_fp32_modules_strict`
    fp32_suffixes = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias", "_conv1d.weight", "dt_bias", "A_log",
                     "hc_attn_base", "hc_attn_scale", "hc_ffn_base", "hc_ffn_scale")
    # 2-D tensors a W8A16 checkpoint keeps (inference/quantize.py): the hyper-connections' mixing
    # weights and the indexer's pool weights are plain parameters, never int8 at load time (an int8
    # copy of them moved logits 0.08 off the load-time model); the vision tower is not ours to change
    int8_dense_suffixes = ("hc_attn_fn", "hc_ffn_fn", "index_kpool_compress_ape", "index_kpool_compress_gate")
    int8_dense_prefixes = ("model.visual.",)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Glm5NextModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def skipped_checkpoint_prefixes(config: ModelConfig) -> tuple[str, ...]:
        """The MTP layer and the vision tower."""
        return (f"{config.checkpoint_prefix}layers.{config.num_hidden_layers}.", "model.visual.")

    def checkpoint_name(self, name: str) -> str:
        prefix = self.config.checkpoint_prefix
        return prefix + name.removeprefix("model.") if name.startswith("model.") else name

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def new_cache(self) -> HybridCache:
        return HybridCache(self.config, self.device, self.model.embed_tokens.weight.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)
        streams = h[:, None].expand(-1, self.config.hc_mult, -1).contiguous()
        chosen = None
        for layer, layer_cache in zip(self.model.layers, cache.layers, strict=True):
            streams, chosen = layer(streams, layer_cache, chosen)
        return self.model.norm(streams.mean(dim=1))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
