"""`python -m inference plan`: does a model fit one GPU, and how much context is left after it?

Works from a published Hugging Face `config.json` alone (no weights, no transformers import), for
`glm4` (dense GQA), `glm4_moe` (GLM-4.5/4.6/4.7), `glm4_moe_lite` (GLM-4.7-Flash, MLA) and
`glm_moe_dsa` (GLM-5, MLA + DeepSeek Sparse Attention indexer). Every tensor is derived from the
config's fields exactly as transformers' modeling code builds it (tests/inference/test_plan.py
checks the count against instantiated transformers models); the MTP layers the checkpoints ship
(`num_nextn_predict_layers`) are counted apart, because transformers drops them and a server only
loads them for MTP speculative decoding.

Weight bytes per `--dtype` (the rule `tensor_bytes` applies):

- bf16: 2 B per parameter; `e_score_correction_bias` is fp32 (4 B), as in the checkpoints. Router
  weights count at bf16 (transformers upcasts them to fp32 at load; a few MiB).
- int8 (W8A16, as `python -m inference quantize` writes it): every linear weight matrix of the
  decoder layers (attention projections, dense MLP, shared and routed experts, MTP `eh_proj`) and
  `lm_head` is 1 B per parameter plus one fp32 scale per output row. Embedding, norms, biases, the
  MoE router, MLA's `kv_b_proj` (read per head, inference/layers/mla.py) and the DSA indexer stay
  bf16.
- fp8 (e4m3, as the official `-FP8` releases): the same decoder-layer linears at 1 B per
  parameter plus one fp32 scale per 128x128 block (`weight_scale_inv`); `lm_head`, embedding,
  norms, biases, router and DSA indexer stay bf16.

KV cache per token is a bf16 cache: GQA stores K and V (2 x kv_heads x head_dim values per
layer); MLA stores the compressed latent (kv_lora_rank + qk_rope_head_dim values per layer), as
vLLM and SGLang cache it; the DSA indexer adds its own key cache (index_head_dim values per layer
that runs an indexer).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from inference.plan_glm5_next import run as run_hybrid
from inference.plan_tensors import (
    BF16,
    DTYPES,
    EMBED,
    FP32,
    GIB,
    HEAD,
    LATENT,
    LINEAR,
    PlanError,
    Tensor,
    tensor_bytes,
)

KIB = 1 << 10
DEFAULT_GPU_GIB = 141.0  # one H200
DEFAULT_RESERVE_GIB = 4.0
DEFAULT_CONTEXT = 32768
MODEL_TYPES = ("glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa")
MLA_TYPES = ("glm4_moe_lite", "glm_moe_dsa")
REMOTE_HINT = (
    "serve it across GPUs with vLLM or SGLang and set INFERENCE_BACKEND=openai "
    '(docs/deploy.md, section 6 "Remote inference")'
)

@dataclass(frozen=True)
class Arch:
    """The fields of a config.json that decide tensor shapes and the KV cache, with
    transformers' defaults for the ones a published config may leave out."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    attention_bias: bool
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    mlp_layer_types: tuple[str, ...]
    num_mtp_layers: int = 0
    use_qk_norm: bool = False
    moe_intermediate_size: int = 0
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    num_experts_per_tok: int = 0
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    indexer_types: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_mla(self) -> bool:
        return self.model_type in MLA_TYPES

    @property
    def is_dsa(self) -> bool:
        return self.model_type == "glm_moe_dsa"

    @property
    def has_moe(self) -> bool:
        return "sparse" in self.mlp_layer_types


def _need(config: dict, key: str):
    if config.get(key) is None:
        raise PlanError(f"config.json has no {key!r} (needed for {config.get('model_type')})")
    return config[key]


def _mlp_layer_types(config: dict, layers: int, default_dense: int) -> tuple[str, ...]:
    """`mlp_layer_types` when the config has it, else `first_k_dense_replace` dense layers
    followed by MoE layers (what the checkpoints and vLLM/SGLang follow)."""
    if config.get("mlp_layer_types") is not None:
        types = tuple(config["mlp_layer_types"])
        if len(types) != layers or set(types) - {"dense", "sparse"}:
            raise PlanError("mlp_layer_types must be num_hidden_layers of 'dense'/'sparse'")
        return types
    dense = config.get("first_k_dense_replace")
    dense = min(int(default_dense if dense is None else dense), layers)
    return ("dense",) * dense + ("sparse",) * (layers - dense)


def _indexer_types(config: dict, layers: int) -> tuple[str, ...]:
    """Which DSA layers run their own indexer ("full") and which reuse the previous full layer's
    top-k ("shared"), resolved as transformers' GlmMoeDsaConfig does."""
    if config.get("indexer_types") is not None:
        types = tuple(config["indexer_types"])
    elif config.get("index_topk_pattern") is not None:
        pattern = config["index_topk_pattern"]
        letters = {"F": "full", "S": "shared"}
        types = (
            tuple(letters.get(c, c) for c in pattern)
            if isinstance(pattern, str)
            else tuple(pattern)
        )
    else:
        freq = max(int(config.get("index_topk_freq") or 1), 1)
        offset = config.get("index_skip_topk_offset")
        offset = 2 if offset is None else int(offset)
        types = tuple(
            "full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)
        )
    if len(types) != layers or set(types) - {"full", "shared"}:
        raise PlanError("indexer_types must be num_hidden_layers of 'full'/'shared'")
    return types


def parse_config(config: dict) -> Arch:
    """Read the architecture of a published config.json (a dict)."""
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise PlanError(f"model_type {model_type!r} is not one of {', '.join(MODEL_TYPES)}")
    layers = int(_need(config, "num_hidden_layers"))
    hidden = int(_need(config, "hidden_size"))
    heads = int(_need(config, "num_attention_heads"))
    common = {
        "model_type": model_type,
        "vocab_size": int(_need(config, "vocab_size")),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        # GQA reads these two; MLA ignores them (transformers' Glm4Config defaults head_dim to 128)
        "num_key_value_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": int(
            config.get("head_dim") or (128 if model_type == "glm4" else hidden // heads)
        ),
        "intermediate_size": int(_need(config, "intermediate_size")),
        "attention_bias": bool(config.get("attention_bias", model_type == "glm4")),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "max_position_embeddings": config.get("max_position_embeddings"),
        "num_mtp_layers": int(config.get("num_nextn_predict_layers") or 0),
    }
    if model_type in ("glm4", "glm4_moe"):
        _need(config, "num_key_value_heads")
    if model_type == "glm4":
        return Arch(mlp_layer_types=("dense",) * layers, **common)
    moe = {
        "moe_intermediate_size": int(_need(config, "moe_intermediate_size")),
        "n_routed_experts": int(_need(config, "n_routed_experts")),
        "n_shared_experts": int(config.get("n_shared_experts", 1) or 0),
        "num_experts_per_tok": int(_need(config, "num_experts_per_tok")),
        "mlp_layer_types": _mlp_layer_types(
            config, layers, 3 if model_type == "glm_moe_dsa" else 1
        ),
    }
    if model_type == "glm4_moe":
        return Arch(use_qk_norm=bool(config.get("use_qk_norm", False)), **common, **moe)
    mla = {
        "q_lora_rank": config.get("q_lora_rank"),
        "kv_lora_rank": int(_need(config, "kv_lora_rank")),
        "qk_nope_head_dim": int(_need(config, "qk_nope_head_dim")),
        "qk_rope_head_dim": int(_need(config, "qk_rope_head_dim")),
        "v_head_dim": int(_need(config, "v_head_dim")),
    }
    if model_type == "glm4_moe_lite":
        return Arch(**common, **moe, **mla)
    if mla["q_lora_rank"] is None:
        raise PlanError("glm_moe_dsa needs q_lora_rank (its indexer reads the q latent)")
    return Arch(
        index_n_heads=int(_need(config, "index_n_heads")),
        index_head_dim=int(_need(config, "index_head_dim")),
        indexer_types=_indexer_types(config, layers),
        **common,
        **moe,
        **mla,
    )


def _linear(name: str, out: int, inp: int, bias: bool, kind: str = LINEAR, **kw) -> list[Tensor]:
    """A linear layer's weight [out, in] and, when it has one, its bias (kept bf16)."""
    weight = [Tensor(f"{name}.weight", (out, inp), kind, **kw)]
    return weight + ([Tensor(f"{name}.bias", (out,), BF16, **kw)] if bias else [])


def _gqa_attention(a: Arch, p: str, mtp: bool) -> list[Tensor]:
    """Glm4Attention / Glm4MoeAttention: q/k/v (bias when attention_bias), o, optional qk norms."""
    q, kv, b = (
        a.num_attention_heads * a.head_dim,
        a.num_key_value_heads * a.head_dim,
        a.attention_bias,
    )
    out = _linear(f"{p}.q_proj", q, a.hidden_size, b, mtp=mtp)
    out += _linear(f"{p}.k_proj", kv, a.hidden_size, b, mtp=mtp)
    out += _linear(f"{p}.v_proj", kv, a.hidden_size, b, mtp=mtp)
    out += _linear(f"{p}.o_proj", a.hidden_size, q, False, mtp=mtp)
    if a.use_qk_norm:
        out += [
            Tensor(f"{p}.{n}.weight", (a.head_dim,), BF16, mtp=mtp) for n in ("q_norm", "k_norm")
        ]
    return out


def _mla_attention(a: Arch, p: str, mtp: bool, indexer: bool) -> list[Tensor]:
    """Multi-head latent attention (Glm4MoeLiteAttention / GlmMoeDsaAttention), and the DSA
    indexer on layers that run one."""
    h, heads, b = a.hidden_size, a.num_attention_heads, a.attention_bias
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    if a.q_lora_rank is None:
        out = _linear(f"{p}.q_proj", heads * qk, h, False, mtp=mtp)
    else:
        out = _linear(f"{p}.q_a_proj", a.q_lora_rank, h, b, mtp=mtp)
        out += [Tensor(f"{p}.q_a_layernorm.weight", (a.q_lora_rank,), BF16, mtp=mtp)]
        out += _linear(f"{p}.q_b_proj", heads * qk, a.q_lora_rank, False, mtp=mtp)
    out += _linear(f"{p}.kv_a_proj_with_mqa", a.kv_lora_rank + a.qk_rope_head_dim, h, b, mtp=mtp)
    out += [Tensor(f"{p}.kv_a_layernorm.weight", (a.kv_lora_rank,), BF16, mtp=mtp)]
    out += _linear(
        f"{p}.kv_b_proj",
        heads * (a.qk_nope_head_dim + a.v_head_dim),
        a.kv_lora_rank,
        False,
        LATENT,
        mtp=mtp,
    )
    out += _linear(f"{p}.o_proj", h, heads * a.v_head_dim, b, mtp=mtp)
    if indexer:
        i = f"{p}.indexer"
        out += _linear(
            f"{i}.wq_b", a.index_n_heads * a.index_head_dim, a.q_lora_rank, False, BF16, mtp=mtp
        )
        out += _linear(f"{i}.wk", a.index_head_dim, h, False, BF16, mtp=mtp)
        out += [  # a LayerNorm: weight and bias
            Tensor(f"{i}.k_norm.{n}", (a.index_head_dim,), BF16, mtp=mtp)
            for n in ("weight", "bias")
        ]
        out += _linear(f"{i}.weights_proj", a.index_n_heads, h, False, BF16, mtp=mtp)
    return out


def _mlp(a: Arch, p: str, inter: int, mtp: bool, **kw) -> list[Tensor]:
    """A SwiGLU MLP; glm4 stores gate and up fused as one gate_up_proj [2*inter, hidden]."""
    h = a.hidden_size
    if a.model_type == "glm4":
        out = [Tensor(f"{p}.gate_up_proj.weight", (2 * inter, h), LINEAR, mtp=mtp, **kw)]
    else:
        out = [
            Tensor(f"{p}.{n}.weight", (inter, h), LINEAR, mtp=mtp, **kw)
            for n in ("gate_proj", "up_proj")
        ]
    return out + [Tensor(f"{p}.down_proj.weight", (h, inter), LINEAR, mtp=mtp, **kw)]


def _moe(a: Arch, p: str, mtp: bool) -> list[Tensor]:
    """Routed experts (each gate, up, down; top-k of them active), the shared experts (one MLP of
    n_shared x moe_intermediate_size), the router and its e_score_correction_bias."""
    experts = {"copies": a.n_routed_experts, "active": a.num_experts_per_tok}
    out = _mlp(a, f"{p}.experts.E", a.moe_intermediate_size, mtp, **experts)
    out += _mlp(a, f"{p}.shared_experts", a.moe_intermediate_size * a.n_shared_experts, mtp)
    out += [Tensor(f"{p}.gate.weight", (a.n_routed_experts, a.hidden_size), BF16, mtp=mtp)]
    return out + [Tensor(f"{p}.gate.e_score_correction_bias", (a.n_routed_experts,), FP32, mtp=mtp)]


def _decoder_layer(a: Arch, i: int, mlp_type: str, mtp: bool, indexer: bool) -> list[Tensor]:
    p, h = f"model.layers.{i}", a.hidden_size
    if a.is_mla:
        out = _mla_attention(a, f"{p}.self_attn", mtp, indexer)
    else:
        out = _gqa_attention(a, f"{p}.self_attn", mtp)
    if mlp_type == "sparse":
        out += _moe(a, f"{p}.mlp", mtp)
    else:
        out += _mlp(a, f"{p}.mlp", a.intermediate_size, mtp)
    norms = ["input_layernorm", "post_attention_layernorm"]
    if a.model_type == "glm4":
        norms += ["post_self_attn_layernorm", "post_mlp_layernorm"]
    return out + [Tensor(f"{p}.{n}.weight", (h,), BF16, mtp=mtp) for n in norms]


def _mtp_layer(a: Arch, i: int) -> list[Tensor]:
    """One MTP module as the checkpoints ship it: a decoder layer (MoE when the model has MoE)
    plus enorm, hnorm, eh_proj [hidden, 2*hidden] and shared_head.norm. It shares the main
    model's embedding and lm_head (vLLM/SGLang load it that way)."""
    p, h = f"model.layers.{i}", a.hidden_size
    out = _decoder_layer(a, i, "sparse" if a.has_moe else "dense", True, a.is_dsa)
    out += [Tensor(f"{p}.{n}.weight", (h,), BF16, mtp=True) for n in ("enorm", "hnorm")]
    out += _linear(f"{p}.eh_proj", h, 2 * h, False, mtp=True)
    return out + [Tensor(f"{p}.shared_head.norm.weight", (h,), BF16, mtp=True)]


def tensors(a: Arch) -> list[Tensor]:
    """Every weight tensor of the checkpoint, main model first, then the MTP layers."""
    h = a.hidden_size
    out = [Tensor("model.embed_tokens.weight", (a.vocab_size, h), EMBED)]
    for i, mlp_type in enumerate(a.mlp_layer_types):
        indexer = a.is_dsa and a.indexer_types[i] == "full"
        out += _decoder_layer(a, i, mlp_type, False, indexer)
    out.append(Tensor("model.norm.weight", (h,), BF16))
    if not a.tie_word_embeddings:
        out.append(Tensor("lm_head.weight", (a.vocab_size, h), HEAD))
    for k in range(a.num_mtp_layers):
        out += _mtp_layer(a, a.num_hidden_layers + k)
    return out


@dataclass(frozen=True)
class KVCache:
    """Bytes per token of a bf16 KV cache, and what plain per-head K/V would take instead."""

    attention: int
    indexer: int
    mha_equivalent: int
    per_layer_values: int
    indexer_layers: int

    @property
    def total(self) -> int:
        return self.attention + self.indexer


def kv_cache(a: Arch, mtp: bool = False, bytes_per_value: int = 2) -> KVCache:
    """KV bytes per token of the main model's layers, or of its MTP layers (`mtp`)."""
    layers = a.num_mtp_layers if mtp else a.num_hidden_layers
    if a.is_mla:
        per_layer = a.kv_lora_rank + a.qk_rope_head_dim
        heads = a.num_attention_heads
        mha = heads * (a.qk_nope_head_dim + a.qk_rope_head_dim) + heads * a.v_head_dim
    else:
        per_layer = mha = 2 * a.num_key_value_heads * a.head_dim
    if not a.is_dsa:
        indexer_layers = 0
    elif mtp:
        indexer_layers = layers  # each MTP layer runs its own indexer
    else:
        indexer_layers = a.indexer_types.count("full")
    return KVCache(
        attention=layers * per_layer * bytes_per_value,
        indexer=indexer_layers * a.index_head_dim * bytes_per_value,
        mha_equivalent=layers * mha * bytes_per_value,
        per_layer_values=per_layer,
        indexer_layers=indexer_layers,
    )


@dataclass(frozen=True)
class Plan:
    """The numbers `render` prints."""

    source: str
    arch: Arch
    dtype: str
    params: int
    active_params: int
    active_core_params: int
    mtp_params: int
    weight_bytes: int
    mtp_weight_bytes: int
    kv: KVCache
    mtp_kv_bytes: int
    gpu_bytes: int
    reserve_bytes: int
    context: int
    context_source: str

    @property
    def free_bytes(self) -> int:
        return self.gpu_bytes - self.reserve_bytes - self.weight_bytes

    @property
    def weights_fit(self) -> bool:
        return self.free_bytes > 0

    @property
    def tokens(self) -> int:
        return max(self.free_bytes, 0) // self.kv.total

    @property
    def sequences(self) -> int:
        return self.tokens // self.context

    @property
    def fits(self) -> bool:
        return self.sequences >= 1

    @property
    def gpus_for_weights(self) -> int:
        return math.ceil(self.weight_bytes / (self.gpu_bytes - self.reserve_bytes))


def make_plan(
    config: dict,
    dtype: str = "bf16",
    gpu_mem_gib: float = DEFAULT_GPU_GIB,
    context: int | None = None,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    source: str = "config.json",
) -> Plan:
    """Count, size and fit one config. `context` defaults to the model's max_position_embeddings
    (or 32768 when the config has none)."""
    if dtype not in DTYPES:
        raise PlanError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    a = parse_config(config)
    every = tensors(a)
    main = [t for t in every if not t.mtp]
    mtp = [t for t in every if t.mtp]
    if context is not None:
        context_source = "--context"
    elif a.max_position_embeddings:
        context, context_source = (
            int(a.max_position_embeddings),
            "the model's max_position_embeddings",
        )
    else:
        context, context_source = (
            DEFAULT_CONTEXT,
            "default; the config has no max_position_embeddings",
        )
    if context < 1:
        raise PlanError("--context must be at least 1")
    if not 0 <= reserve_gib < gpu_mem_gib:
        raise PlanError("the reserve must be at least 0 and less than the GPU memory")
    return Plan(
        source=source,
        arch=a,
        dtype=dtype,
        params=sum(t.numel for t in main),
        active_params=sum(t.active_numel for t in main if t.kind != EMBED or a.tie_word_embeddings),
        active_core_params=sum(t.active_numel for t in main if t.kind not in (EMBED, HEAD)),
        mtp_params=sum(t.numel for t in mtp),
        weight_bytes=sum(tensor_bytes(t, dtype) for t in main),
        mtp_weight_bytes=sum(tensor_bytes(t, dtype) for t in mtp),
        kv=kv_cache(a),
        mtp_kv_bytes=kv_cache(a, mtp=True).total,
        gpu_bytes=int(gpu_mem_gib * GIB),
        reserve_bytes=int(reserve_gib * GIB),
        context=context,
        context_source=context_source,
    )


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f} GiB"


def _kib(n: int) -> str:
    return f"{n / KIB:,.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):,.2f} MiB"


def _billions(n: int) -> str:
    return f"{n / 1e9:,.2f}B ({n:,})"


def _row(label: str, text: str) -> str:
    return f"  {label:<17} {text}"


INDENT = " " * 20
DTYPE_RULES = {
    "bf16": "2 B/param; e_score_correction_bias fp32",
    "int8": "W8A16: layer linears + lm_head 1 B/param + fp32 scale per output row; rest bf16",
    "fp8": "e4m3 layer linears 1 B/param + fp32 scale per 128x128 block; lm_head and rest bf16",
}


def _active_lines(p: Plan) -> list[str]:
    a = p.arch
    if a.has_moe:
        moe_layers = a.mlp_layer_types.count("sparse")
        what = (
            f"dense parts + {a.num_experts_per_tok} of {a.n_routed_experts} routed experts"
            f" + {a.n_shared_experts} shared in each of {moe_layers} MoE layers"
        )
    else:
        what = "dense: every layer"
    return [
        _row("active per token", f"{_billions(p.active_params)}: {what} + lm_head"),
        f"{INDENT}(read per decoded token; the embedding is left out, a token reads one row of it)",
        f"{INDENT}{p.active_core_params / 1e9:,.2f}B without lm_head, as published 'A..B' figures count",
    ]


def _mtp_lines(p: Plan) -> list[str]:
    a = p.arch
    if not a.num_mtp_layers:
        return [_row("MTP layers", "none in this config")]
    return [
        _row(
            "MTP layers",
            f"+{_gib(p.mtp_weight_bytes)} ({a.num_mtp_layers} layer(s), {_billions(p.mtp_params)},"
            f" +{_kib(p.mtp_kv_bytes)}/token KV)",
        ),
        f"{INDENT}not included in the figures above or below: loaded only for MTP speculation",
    ]


def _kv_lines(p: Plan) -> list[str]:
    a, kv = p.arch, p.kv
    layers = a.num_hidden_layers
    if not a.is_mla:
        return [
            _row(
                "KV cache (bf16)",
                f"{_kib(kv.total)}/token = {layers} layers x 2 (K,V) x {a.num_key_value_heads}"
                f" kv heads x {a.head_dim} head_dim x 2 B",
            )
        ]
    lines = [
        _row("KV cache (bf16)", f"{_kib(kv.total)}/token"),
        _row(
            "  MLA latent",
            f"{_kib(kv.attention)} = {layers} layers x ({a.kv_lora_rank} kv_lora_rank"
            f" + {a.qk_rope_head_dim} rope) values x 2 B",
        ),
    ]
    if a.is_dsa:
        lines.append(
            _row(
                "  DSA indexer",
                f"{_kib(kv.indexer)} = {kv.indexer_layers} indexer layers x {a.index_head_dim}"
                " values x 2 B",
            )
        )
    lines.append(
        _row(
            "  as plain MHA",
            f"{_kib(kv.mha_equivalent)}/token for per-head K/V ({a.num_attention_heads} heads x"
            f" ({a.qk_nope_head_dim}+{a.qk_rope_head_dim} K + {a.v_head_dim} V) x {layers} layers"
            f" x 2 B), {kv.mha_equivalent / kv.attention:,.1f}x the latent",
        )
    )
    return lines


def _fit_lines(p: Plan) -> list[str]:
    lines = [
        _row(
            "GPU",
            f"{_gib(p.gpu_bytes)}, of which {_gib(p.reserve_bytes)} is kept in reserve for"
            " activations, workspace and the CUDA context",
        )
    ]
    if not p.weights_fit:
        return lines + [
            _row(
                "fit",
                f"does not fit: the {p.dtype} weights alone ({_gib(p.weight_bytes)}) exceed one"
                f" {_gib(p.gpu_bytes)} GPU less the reserve",
            ),
            f"{INDENT}(at least {p.gpus_for_weights} such GPUs for the weights, before any KV cache);",
            f"{INDENT}{REMOTE_HINT}",
        ]
    seqs = "sequence" if p.sequences == 1 else "sequences"
    lines += [
        _row("free for KV", f"{_gib(p.free_bytes)} = GPU - reserve - weights"),
        _row("context", f"{p.context:,} tokens per sequence ({p.context_source})"),
        _row(
            "fit",
            f"fits: {p.tokens:,} tokens of KV cache = {p.sequences:,} concurrent {seqs}"
            f" of {p.context:,} tokens",
        ),
    ]
    if not p.fits:
        lines[-1] = _row(
            "fit",
            f"does not fit: {p.tokens:,} tokens of KV cache, not one sequence of {p.context:,}",
        )
        lines += [
            f"{INDENT}(a shorter --context or a smaller --dtype may fit); or {REMOTE_HINT}",
        ]
    return lines


def render(p: Plan) -> str:
    """The report `python -m inference plan` prints."""
    a = p.arch
    attention = "MLA + DSA indexer" if a.is_dsa else "MLA" if a.is_mla else "GQA"
    head = (
        f"{p.source}: {a.model_type}, {a.num_hidden_layers} layers, hidden {a.hidden_size},"
        f" {attention} attention"
    )
    lines = [head, _row("parameters", _billions(p.params))]
    lines += _active_lines(p)
    lines.append(_row(f"weights ({p.dtype})", f"{_gib(p.weight_bytes)} ({DTYPE_RULES[p.dtype]})"))
    lines += _mtp_lines(p)
    return "\n".join(lines + _kv_lines(p) + _fit_lines(p))


def load_config(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PlanError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"{path}: not JSON ({e})") from None


def run(
    config_path: str,
    dtype: str = "bf16",
    gpu_mem_gib: float = DEFAULT_GPU_GIB,
    context: int | None = None,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
) -> tuple[int, str]:
    """The command: (exit code, text). 0 when at least one sequence of `context` fits on the GPU,
    1 when it does not (weights or KV), 2 when the config cannot be planned."""
    try:
        config = load_config(config_path)
        if config.get("model_type") == "glm5_next":  # a hybrid: its own planner
            return run_hybrid(config, str(config_path), dtype, gpu_mem_gib, context, reserve_gib)
        plan = make_plan(config, dtype, gpu_mem_gib, context, reserve_gib, str(config_path))
    except PlanError as e:
        return 2, f"plan: {e}"
    return (0 if plan.fits else 1), render(plan)
