"""Hugging Face `Glm4MoeForCausalLM` (GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7) on the engine's layers.

A GQA decoder like GLM-4 but without its sandwich norms: q/k/v biased when `attention_bias`, an
RMSNorm over each q and k head when `use_qk_norm`, partial rotary on halves (`rotate_half`), and
per `mlp_layer_types` a dense SwiGLU (the first `first_k_dense_replace` layers) or GLM's Mixture
of Experts (`inference.layers.moe`). No router over attention paths.
A `sliding_window` override runs the sparse contract in union mode, as for GLM-4.

MTP: the published GLM-4.5+ (and GLM-4.7-Flash, GLM-5, DeepSeek-V3) checkpoints carry
`num_nextn_predict_layers` multi-token-prediction layers after the decoder layers, as layers
`num_hidden_layers + K` (transformers drops them). When the checkpoint has them the loader sets
`config.num_mtp_heads` to their count and they load as `model.mtp.K` (`NextNLayer`: a decoder
layer of the model's own class, MoE and, for GLM-5, its own DSA indexer, as vLLM's and SGLang's
MTP loaders build it) for speculative decoding (inference/engine/speculative.py, the engine's
`speculative_k`); without them the model loads without MTP and speculative decoding is refused.
Their `embed_tokens` and `shared_head.head` are copies of the model's embedding and lm head
(DeepSeek-V3's MTP shares both by design; SGLang's loader skips them for the target model's):
not read. `shared_head.norm` is the layer's own final norm: loaded and used.

Weight names (N = layer, E = expert), as the published checkpoints and transformers store them:
    model.layers.N.self_attn.{q,k,v}_proj.{weight,bias}, o_proj.weight, {q,k}_norm.weight
    model.layers.N.{input,post_attention}_layernorm.weight
    model.layers.N.mlp.{gate,up,down}_proj.weight                      dense layers
    model.layers.N.mlp.gate.weight [experts, hidden], gate.e_score_correction_bias [experts]
    model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight            sparse layers
    model.layers.N.mlp.shared_experts.{gate,up,down}_proj.weight
MTP layer M = num_hidden_layers + K (published checkpoints only):
    model.layers.M.enorm.weight, hnorm.weight [hidden]
    model.layers.M.eh_proj.weight [hidden, 2 * hidden]   (input [enorm(embed(next)) ; hnorm(hidden)])
    model.layers.M.shared_head.norm.weight [hidden]
    model.layers.M.<a decoder layer's names: self_attn.*, mlp.* (MoE), *_layernorm>
    model.layers.M.embed_tokens.weight, shared_head.head.weight    copies, not read
"""

import torch
from torch import nn

from inference.config import ModelConfig
from inference.layers.attention import Attention
from inference.layers.caches.gqa_sequence import LayerCache
from inference.layers.linear import Linear
from inference.layers.moe import MoE, SwiGLU
from inference.layers.norm import RMSNorm
from inference.models.glm5_sparse import Glm5SparseForCausalLM, MTPModule


def sparse_mlp(config: ModelConfig, index: int) -> bool:
    """Whether layer `index` runs the MoE (`mlp_layer_types`); an MTP layer (index
    `num_hidden_layers` on) as the last decoder layer (vLLM: index >= first_k_dense_replace)."""
    types = config.mlp_layer_types
    return bool(types) and types[min(index, len(types) - 1)] == "sparse"


class Glm4MoeDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(config) if sparse_mlp(config, index) else SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, h: torch.Tensor, rotations: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        norms = None if self.self_attn.window is None else torch.linalg.vector_norm(h, dim=-1, dtype=torch.float32)
        h = h + self.self_attn(self.input_layernorm(h), rotations, cache, norms)
        return h + self.mlp(self.post_attention_layernorm(h))


class SharedHead(nn.Module):
    """`shared_head.norm`: the MTP layer's own final norm (its `head` is the model's lm head)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class NextNLayer(MTPModule):
    """One published MTP layer: `MTPModule` (enorm, hnorm, eh_proj, then a decoder block, here
    built as layer `index` of the model's own class) plus its `shared_head.norm`."""

    def __init__(self, config: ModelConfig, layer_class: type[nn.Module], index: int) -> None:
        nn.Module.__init__(self)
        self.enorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hnorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.eh_proj = Linear(2 * config.hidden_size, config.hidden_size)
        self.shared_head = SharedHead(config)
        self.block = layer_class(config, index)


class Glm4MoeForCausalLM(Glm5SparseForCausalLM):
    layer_class = Glm4MoeDecoderLayer
    mtp_class: type[NextNLayer] = NextNLayer
    fp32_suffixes = MoE.FP32_SUFFIXES

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        first = config.num_hidden_layers
        self.model.mtp = nn.ModuleList(self.mtp_class(config, self.layer_class, first + k)
                                       for k in range(config.num_mtp_heads))

    @staticmethod
    def mtp_heads_in_checkpoint(config: ModelConfig, names) -> int:
        """The MTP layers the checkpoint carries: layers `num_hidden_layers + K` with an
        `eh_proj`, K from 0 up to `num_nextn_predict_layers`."""
        first, count = config.num_hidden_layers, 0
        while count < config.num_nextn_predict_layers and f"model.layers.{first + count}.eh_proj.weight" in names:
            count += 1
        return count

    @staticmethod
    def skipped_checkpoint_prefixes(config: ModelConfig) -> tuple[str, ...]:
        """MTP layers beyond `num_mtp_heads` (all of them when the model runs none), and the
        copies of the embedding and lm head that the loaded ones carry."""
        first, heads = config.num_hidden_layers, config.num_mtp_heads
        layers = tuple(f"model.layers.{first + k}." for k in range(heads, config.num_nextn_predict_layers))
        copies = tuple(f"model.layers.{first + k}.{part}." for k in range(heads)
                       for part in ("embed_tokens", "shared_head.head"))
        return layers + copies

    def checkpoint_name(self, name: str) -> str:
        """`model.mtp.K.block.X` and `model.mtp.K.X` are `model.layers.{num_hidden_layers + K}.X`
        in the published checkpoints."""
        if not name.startswith("model.mtp."):
            return name
        k, _, rest = name.removeprefix("model.mtp.").partition(".")
        return f"model.layers.{self.config.num_hidden_layers + int(k)}.{rest.removeprefix('block.')}"

    def mtp_forward(self, depth: int, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                    cache, module: NextNLayer | None = None, layer_cache=None) -> torch.Tensor:
        """`Glm5SparseForCausalLM.mtp_forward`, normed by the layer's own `shared_head.norm`."""
        rotations = self.rotary.rotations(positions)
        layer_cache = cache.layers[self.config.num_hidden_layers + depth] if layer_cache is None else layer_cache
        module = self.model.mtp[depth] if module is None else module
        out = module(self.model.embed_tokens(next_ids), hidden, rotations, layer_cache)
        return module.shared_head.norm(out)
