"""Hugging Face `Glm4ForCausalLM` checkpoints on the engine's layers.

GLM-4 differs from GLM-5 sparse only inside the decoder layer: biased q/k/v projections (from
the config's `attention_bias`) and two extra "sandwich" norms, `post_self_attn_layernorm` on the
attention output and `post_mlp_layernorm` on the MLP output, before each residual add. It has no
router (sparse means union mode) and no MTP modules.
"""

import torch

from inference.config import ModelConfig
from inference.layers.caches.gqa_sequence import LayerCache
from inference.layers.norm import RMSNorm
from inference.models.glm5_sparse import DecoderLayer, Glm5SparseForCausalLM


class Glm4DecoderLayer(DecoderLayer):
    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__(config, index)
        self.post_self_attn_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_mlp_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, rotations: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        x = self.input_layernorm(h)
        h = h + self.post_self_attn_layernorm(self.self_attn(x, rotations, cache, self.node_norms(h)))
        return h + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(h)))


class Glm4ForCausalLM(Glm5SparseForCausalLM):
    layer_class = Glm4DecoderLayer
