"""Hugging Face `GlmMoeDsaForCausalLM` (GLM-5) on the engine's layers.

GLM-4.7-Flash's decoder (inference/models/glm4_moe_lite.py: MLA, a few dense layers, then GLM's
Mixture of Experts) with DeepSeek Sparse Attention (inference/layers/dsa.py): each "full" layer's
lightning indexer picks `index_topk` positions a query, and the "shared" layers after it attend
to the same ones, so the model's forward hands each layer's choice to the next. The cache keeps
MLA's latent rows plus the full layers' indexer keys (inference/layers/caches/dsa.py, `LAYOUTS`
under this model type). The MTP layer the published checkpoint carries (layer
`num_hidden_layers`, see inference/models/glm4_moe.py) is a full DSA layer with its own indexer
(`model.layers.M.self_attn.indexer.*`, as vLLM's DeepSeek-V3.2 MTP builds it): loaded when present,
for speculative decoding.

Weight names: glm4_moe_lite's, plus in full layers
    model.layers.N.self_attn.indexer.wq_b.weight [index_n_heads * index_head_dim, q_lora_rank]
    model.layers.N.self_attn.indexer.wk.weight [index_head_dim, hidden]
    model.layers.N.self_attn.indexer.k_norm.{weight,bias} [index_head_dim]
    model.layers.N.self_attn.indexer.weights_proj.weight [index_n_heads, hidden]
"""

import torch
from torch import nn

from inference.config import ModelConfig
from inference.layers.dsa import DSAttention
from inference.layers.moe import MoE, SwiGLU
from inference.layers.norm import RMSNorm
from inference.models.glm4_moe import NextNLayer, sparse_mlp
from inference.models.glm4_moe_lite import Glm4MoeLiteForCausalLM


class GlmMoeDsaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DSAttention(config, index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(config) if sparse_mlp(config, index) else SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, h: torch.Tensor, rotations: torch.Tensor, cache,
                chosen: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        out, chosen = self.self_attn(self.input_layernorm(h), rotations, cache, chosen)
        h = h + out
        return h + self.mlp(self.post_attention_layernorm(h)), chosen


class GlmMoeDsaNextNLayer(NextNLayer):
    """GLM-5's MTP layer: its block is a full DSA layer (its own indexer picks for it)."""

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, rotations: torch.Tensor, cache) -> torch.Tensor:
        h = self.eh_proj(torch.cat((self.enorm(embeds), self.hnorm(hidden)), dim=-1))
        return self.block(h, rotations, cache, None)[0]


class GlmMoeDsaForCausalLM(Glm4MoeLiteForCausalLM):
    layer_class = GlmMoeDsaDecoderLayer
    mtp_class = GlmMoeDsaNextNLayer

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)
        rotations = self.rotary.rotations(positions)
        chosen = None
        for layer, layer_cache in zip(self.model.layers, cache.layers, strict=False):
            h, chosen = layer(h, rotations, layer_cache, chosen)
        return self.model.norm(h)
