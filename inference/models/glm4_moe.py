"""Hugging Face `Glm4MoeForCausalLM` (GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7) on the engine's layers.

A GQA decoder like GLM-4 but without its sandwich norms: q/k/v biased when `attention_bias`, an
RMSNorm over each q and k head when `use_qk_norm`, partial rotary on halves (`rotate_half`), and
per `mlp_layer_types` a dense SwiGLU (the first `first_k_dense_replace` layers) or GLM's Mixture
of Experts (`inference.layers.moe`). No router over attention paths and no MTP modules here: the
MTP layer the published checkpoints carry (layer `num_hidden_layers`) is skipped at load.
A `sliding_window` override runs the sparse contract in union mode, as for GLM-4.

Weight names (N = layer, E = expert), as the published checkpoints and transformers store them:
    model.layers.N.self_attn.{q,k,v}_proj.{weight,bias}, o_proj.weight, {q,k}_norm.weight
    model.layers.N.{input,post_attention}_layernorm.weight
    model.layers.N.mlp.{gate,up,down}_proj.weight                      dense layers
    model.layers.N.mlp.gate.weight [experts, hidden], gate.e_score_correction_bias [experts]
    model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight            sparse layers
    model.layers.N.mlp.shared_experts.{gate,up,down}_proj.weight
"""

import torch
from torch import nn

from inference.config import ModelConfig
from inference.kv_cache import LayerCache
from inference.layers.attention import Attention
from inference.layers.moe import MoE, SwiGLU
from inference.layers.norm import RMSNorm
from inference.models.glm5_sparse import Glm5SparseForCausalLM


class Glm4MoeDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        sparse = bool(config.mlp_layer_types) and config.mlp_layer_types[index] == "sparse"
        self.mlp = MoE(config) if sparse else SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, h: torch.Tensor, rotations: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        norms = None if self.self_attn.window is None else torch.linalg.vector_norm(h, dim=-1, dtype=torch.float32)
        h = h + self.self_attn(self.input_layernorm(h), rotations, cache, norms)
        return h + self.mlp(self.post_attention_layernorm(h))


class Glm4MoeForCausalLM(Glm5SparseForCausalLM):
    layer_class = Glm4MoeDecoderLayer
    fp32_suffixes = MoE.FP32_SUFFIXES

    @staticmethod
    def skipped_checkpoint_prefixes(config: ModelConfig) -> tuple[str, ...]:
        """The MTP layers' tensors, which this model does not run."""
        first = config.num_hidden_layers
        return tuple(f"model.layers.{first + i}." for i in range(config.num_nextn_predict_layers))
