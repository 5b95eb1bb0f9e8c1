"""GLM-5 sparse: this project's architecture.

A GQA decoder with GLM partial rotary, RMSNorm, SwiGLU, the sparse attention of
`inference.layers.attention` (routed by a per-layer router), and DeepSeek-V3 style MTP modules.

Weight names (Hugging Face like; N = layer, K = MTP module):
    model.embed_tokens.weight                          [vocab, hidden]
    model.layers.N.input_layernorm.weight              [hidden]
    model.layers.N.self_attn.{q,k,v}_proj.weight       [heads * head_dim | kv_heads * head_dim, hidden]
    model.layers.N.self_attn.{q,k,v}_proj.bias         only with attention_bias
    model.layers.N.self_attn.o_proj.weight             [hidden, heads * head_dim]
    model.layers.N.router.weight                       [3, hidden]  (local, global, skip); routed only
    model.layers.N.post_attention_layernorm.weight     [hidden]
    model.layers.N.mlp.gate_up_proj.weight             [2 * intermediate, hidden]  ([gate ; up])
    model.layers.N.mlp.down_proj.weight                [hidden, intermediate]
    model.norm.weight                                  [hidden]
    model.mtp.K.enorm.weight, model.mtp.K.hnorm.weight [hidden]
    model.mtp.K.eh_proj.weight                         [hidden, 2 * hidden]  (input [enorm(e) ; hnorm(h)])
    model.mtp.K.block.<the decoder-layer names above>
    lm_head.weight                                     [vocab, hidden]  (absent when tied)
In memory q/k/v are one `self_attn.qkv_proj` (`PackedLinear`); the loader stacks the three.
"""

from __future__ import annotations

import torch
from torch import nn

from inference.config import ModelConfig
from inference.layers.activation import silu_and_mul
from inference.layers.attention import Attention
from inference.layers.caches.gqa_sequence import LayerCache
from inference.layers.caches.kv_cache import KVCache
from inference.layers.linear import Int8Linear, Linear, input_major, weight_key
from inference.layers.norm import RMSNorm
from inference.layers.rotary import RotaryEmbedding


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.router = Linear(config.hidden_size, 3) if config.routed else None
        self.route_threshold = config.route_threshold
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def node_norms(self, h: torch.Tensor) -> torch.Tensor | None:
        """L2 norms of the un-normed layer input: what key-node election ranks (sparse only)."""
        if self.self_attn.window is None:
            return None
        return torch.linalg.vector_norm(h, dim=-1, dtype=torch.float32)

    def gate(self, x: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor | None:
        """Routed mode: (p_local, p_global) of softmax(router(x)), zero where below the threshold
        (`logits`: router(x) when already computed)."""
        if self.router is None:
            return None
        logits = self.router(x) if logits is None else logits
        p = torch.softmax(logits, dim=-1, dtype=torch.float32)[:, :2]
        if self.route_threshold <= 0:  # probabilities are never below it: nothing to zero
            return p
        return torch.where(p >= self.route_threshold, p, torch.zeros_like(p))

    def qkv_and_gate(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Routed inference: q/k/v and the router in one matmul (the router alone is a whole
        matmul call for 3 outputs, one per layer and step), dense or int8; otherwise (None, the
        gate)."""
        qkv, router = self.self_attn.qkv_proj, self.router
        dense = isinstance(router, nn.Linear) and isinstance(qkv, nn.Linear)
        int8 = isinstance(router, Int8Linear) and isinstance(qkv, Int8Linear)
        if not (dense or int8) or torch.is_grad_enabled():  # no router, or training
            return None, self.gate(x)
        both = (self.fused_projection() if dense else self.fused_int8())(x)
        rows = qkv.out_features
        return both[:, :rows], self.gate(x, both[:, rows : rows + 3])

    def _fused(self, name: str, build):
        """`build(qkv_proj, router, pad)`'s layer, cached under `name` until a weight, bias or
        (int8) scale of either changes; `pad` rows round `[qkv ; router]` up to a multiple of 8, so that q/k rows keep
        the even, aligned strides that the in-place complex rotary needs."""
        qkv, router = self.self_attn.qkv_proj, self.router
        parts = (qkv.weight, qkv.bias, getattr(qkv, "scales", None), router.weight, router.bias,
                 getattr(router, "scales", None))
        key = tuple(None if t is None else weight_key(t) for t in parts)
        cached = self.__dict__.get(name)
        if cached is None or cached[0] != key:
            cached = self.__dict__[name] = (key, build(qkv, router, -(qkv.out_features + 3) % 8))
        return cached[1]

    def fused_projection(self) -> Linear:
        """`[qkv_proj ; router ; zero rows]` as one `Linear`."""
        return self._fused("_fused_dense", _fused_dense)

    def fused_int8(self) -> Int8Linear:
        """`fused_projection` for int8 layers: per-channel int8 rows and their scales stack
        just as dense rows do (zero rows with scale 1 as padding)."""
        return self._fused("_fused8", _fused_int8)

    def forward(self, h: torch.Tensor, rotations: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        x = self.input_layernorm(h)
        qkv, gate = self.qkv_and_gate(x)
        h = h + self.self_attn(x, rotations, cache, self.node_norms(h), gate, qkv)
        return h + self.mlp(self.post_attention_layernorm(h))


def _fused_dense(qkv: nn.Linear, router: nn.Linear, pad: int) -> Linear:
    weight = torch.cat((qkv.weight, router.weight, router.weight.new_zeros(pad, router.in_features))).detach()
    if weight.device.type == "cpu" and weight.dtype == torch.float32:
        weight = input_major(weight)
    fused = Linear(weight.shape[1], weight.shape[0], bias=qkv.bias is not None)
    fused.to(weight.device, weight.dtype)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if qkv.bias is not None:
        fused.bias = nn.Parameter(torch.cat((qkv.bias, qkv.bias.new_zeros(3 + pad))).detach(), requires_grad=False)
    return fused


def _fused_int8(qkv: Int8Linear, router: Int8Linear, pad: int) -> Int8Linear:
    weight = torch.cat((qkv.weight, router.weight, router.weight.new_zeros(pad, router.in_features)))
    scales = torch.cat((qkv.scales, router.scales, router.scales.new_ones(pad)))
    bias = None
    if qkv.bias is not None or router.bias is not None:
        parts = [qkv.bias if qkv.bias is not None else qkv.scales.new_zeros(qkv.out_features),
                 router.bias if router.bias is not None else router.scales.new_zeros(3)]
        bias = torch.cat((*parts, parts[0].new_zeros(pad)))
    return Int8Linear(weight.contiguous(), scales, bias)


class MTPModule(nn.Module):
    """One DeepSeek-V3 multi-token-prediction depth: from the hidden state at position i and the
    embedding of token i+1 it makes a hidden state that the shared norm + lm head turn into a guess
    for the token after that."""

    def __init__(self, config: ModelConfig, layer_class: type[DecoderLayer]) -> None:
        super().__init__()
        self.enorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hnorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.eh_proj = Linear(2 * config.hidden_size, config.hidden_size)
        self.block = layer_class(config)

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, rotations: torch.Tensor, cache: LayerCache
    ) -> torch.Tensor:
        h = self.eh_proj(torch.cat((self.enorm(embeds), self.hnorm(hidden)), dim=-1))
        return self.block(h, rotations, cache)


class Glm5SparseModel(nn.Module):
    def __init__(self, config: ModelConfig, layer_class: type[DecoderLayer]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layer_class(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mtp = nn.ModuleList(MTPModule(config, layer_class) for _ in range(config.num_mtp_heads))


class Glm5SparseForCausalLM(nn.Module):
    """One sequence at a time: `forward(ids [L], positions [L], cache)` runs positions
    `[cache.length, cache.length + L)` and returns their final-normed hidden states `[L, hidden]`;
    `compute_logits` turns the rows you need into logits. Prefill in one call or in chunks,
    decode one token per call: the cache makes all of them agree."""

    layer_class: type[DecoderLayer] = DecoderLayer  # built as layer_class(config, index)
    fp32_suffixes: tuple[str, ...] = ()  # parameters the loader keeps in fp32 whatever the dtype

    @staticmethod
    def skipped_checkpoint_prefixes(config: ModelConfig) -> tuple[str, ...]:
        """Checkpoint tensors this model does not use (and the loader does not read)."""
        return ()

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Glm5SparseModel(config, self.layer_class)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta)

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def new_cache(self) -> KVCache:
        return KVCache(self.config, self.device, self.model.embed_tokens.weight.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)
        rotations = self.rotary.rotations(positions)
        for layer, layer_cache in zip(self.model.layers, cache.layers, strict=False):
            h = layer(h, rotations, layer_cache)
        return self.model.norm(h)

    def mtp_forward(
        self,
        depth: int,
        hidden: torch.Tensor,
        next_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None,
        module: MTPModule | None = None,
        layer_cache=None,
    ) -> torch.Tensor:
        """MTP depth `depth`: `hidden [L, hidden]` (the previous depth's output, depth 0 the
        model's) at `positions`, `next_ids [L]` the tokens one step ahead. Returns the normed
        hidden state, ready for `compute_logits` or the next depth. `module` stands in for
        `model.mtp[depth]` (speculative decoding drafts with an int8 copy); `layer_cache` for
        the depth's layer of `cache` (the serving engine's drafts of several sequences at once)."""
        rotations = self.rotary.rotations(positions)
        layer_cache = cache.layers[self.config.num_hidden_layers + depth] if layer_cache is None else layer_cache
        embeds = self.model.embed_tokens(next_ids)
        module = self.model.mtp[depth] if module is None else module
        return self.model.norm(module(embeds, hidden, rotations, layer_cache))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
