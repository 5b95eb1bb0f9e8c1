"""Hugging Face `Glm4MoeLiteForCausalLM` (GLM-4.7-Flash) on the engine's layers.

glm4_moe's decoder (pre-norm residual blocks, a dense first layer then GLM's Mixture of Experts,
`inference.layers.moe`, whose router and experts transformers' Glm4MoeLite shares line for line)
with DeepSeek's Multi-head Latent Attention in place of GQA (`inference.layers.mla`): its cache
is one latent row per position and layer (`inference.layers.caches.mla`, `LAYOUTS` under this
model type). The MTP layer the published checkpoint carries (layer `num_hidden_layers`) loads
as for glm4_moe (its block an MLA layer), for speculative decoding.

Weight names (N = layer, E = expert), as the published checkpoint and transformers store them:
    model.layers.N.self_attn.q_a_proj.weight [q_lora_rank, hidden], q_a_layernorm.weight,
        q_b_proj.weight [heads * (qk_nope + qk_rope), q_lora_rank]    (or q_proj when q_lora_rank is null)
    model.layers.N.self_attn.kv_a_proj_with_mqa.weight [kv_lora_rank + qk_rope, hidden],
        kv_a_layernorm.weight [kv_lora_rank], kv_b_proj.weight [heads * (qk_nope + v_head), kv_lora_rank]
    model.layers.N.self_attn.o_proj.weight [hidden, heads * v_head]   (q_a, kv_a, o biased when attention_bias)
    model.layers.N.{input,post_attention}_layernorm.weight, model.layers.N.mlp.*  as glm4_moe
"""

import torch
from torch import nn

from inference.config import ModelConfig
from inference.layers.mla import MLAttention
from inference.layers.moe import MoE, SwiGLU
from inference.layers.norm import RMSNorm
from inference.layers.rotary import RotaryEmbedding
from inference.models.glm4_moe import Glm4MoeForCausalLM, sparse_mlp


class Glm4MoeLiteDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MLAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(config) if sparse_mlp(config, index) else SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, h: torch.Tensor, rotations: torch.Tensor, cache) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rotations, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Glm4MoeLiteForCausalLM(Glm4MoeForCausalLM):
    layer_class = Glm4MoeLiteDecoderLayer

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta, config.rope_scaling,
                                      config.max_position_embeddings)
