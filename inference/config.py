"""The model configuration: one dataclass read from a Hugging Face style `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

MODEL_TYPES = ("glm5_sparse", "glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "glm5_next")
MOE_TYPES = ("glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "glm5_next")
MLA_TYPES = ("glm4_moe_lite", "glm_moe_dsa")  # Multi-head Latent Attention
INDEXER_TYPES = ("full", "shared")
MLP_LAYER_TYPES = ("dense", "sparse")
QUANTIZATIONS = (None, "w8a16")


def resolve_dtype(name: str | torch.dtype | None) -> torch.dtype:
    """Map a config or command-line dtype name to a torch dtype (fp32 when unset)."""
    if name is None:
        return torch.float32
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name.removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; use one of {sorted(_DTYPES)}") from None


def serving_dtype(config: ModelConfig, device: torch.device) -> torch.dtype:
    """The dtype a model loads in on `device`: the caller's or the checkpoint's, except an fp32
    checkpoint on CUDA that the caller did not pin, which serves in bf16 (as vLLM's "auto"
    halves fp32 checkpoints; the GPU path is built for 16-bit weights)."""
    if device.type == "cuda" and config.dtype == torch.float32 and not config.dtype_given:
        return torch.bfloat16
    return config.dtype


def default_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class ModelConfig:
    """Everything the engine needs to build and run a model.

    `glm5_sparse` is this project's architecture: GQA + GLM partial rotary, sparse attention
    (window `sliding_window`, key-node interval `global_interval`), a router per layer when
    `routed`, and `num_mtp_heads` DeepSeek-V3 style MTP modules. `glm4` is Hugging Face's
    `Glm4ForCausalLM`: dense unless a `sliding_window` is set (in the config or as an override),
    in which case it runs the sparse contract in union mode (one softmax over window + nodes).
    `glm4_moe` is Hugging Face's `Glm4MoeForCausalLM` (GLM-4.5, 4.5-Air, 4.6, 4.7): GLM-4's
    attention without the sandwich norms, its rotary on halves instead of pairs, optional q/k
    norms, and from `mlp_layer_types` "sparse" layers on a Mixture of Experts (`n_routed_experts`
    experts of `moe_intermediate_size`, `num_experts_per_tok` a token, `n_shared_experts` always).
    `glm4_moe_lite` is Hugging Face's `Glm4MoeLiteForCausalLM` (GLM-4.7-Flash): glm4_moe's MoE
    under DeepSeek's Multi-head Latent Attention (the `kv_lora_rank`... fields; `head_dim` is
    `qk_rope_head_dim` there, as transformers maps it, and the rotary turns all of it).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.5
    max_position_embeddings: int = 131072
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    global_interval: int | None = None
    routed: bool = False
    route_threshold: float = 0.0
    num_mtp_heads: int = 0
    eos_token_ids: list[int] = field(default_factory=list)
    dtype: torch.dtype = torch.float32
    dtype_given: bool = False  # chosen by the caller; else the checkpoint's (fp32 serves in bf16 on CUDA)
    quantization: str | None = None  # "w8a16": int8 weight-only linear layers
    # GLM-4's rotary turns channel pairs (2i, 2i+1); glm4_moe's turns (i, i + rotary_dim / 2)
    rotary_interleaved: bool = True
    use_qk_norm: bool = False  # an RMSNorm over each q and k head before the rotary
    # Mixture of experts (glm4_moe): per layer "dense" (an MLP of intermediate_size) or "sparse"
    mlp_layer_types: list[str] = field(default_factory=list)  # empty: every layer dense
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    # Multi-head Latent Attention (glm4_moe_lite): queries through a rank-`q_lora_rank` bottleneck
    # (None: one q_proj), keys and values from one shared latent of `kv_lora_rank` plus a rotary
    # key of `qk_rope_head_dim`; per head `qk_nope_head_dim` + `qk_rope_head_dim` query/key
    # channels and `v_head_dim` value channels
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # YaRN (rope_type "yarn"): the config's `rope_parameters` as given (factor,
    # original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim, ...)
    rope_scaling: dict | None = None
    # DeepSeek Sparse Attention (glm_moe_dsa, GLM-5): per layer "full" (its own lightning
    # indexer of `index_n_heads` x `index_head_dim` picks `index_topk` positions a query) or
    # "shared" (the previous full layer's choice)
    indexer_types: list[str] = field(default_factory=list)
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    # MTP layers a glm4_moe / glm4_moe_lite / glm_moe_dsa checkpoint may ship after the decoder
    # layers (layer num_hidden_layers onwards); the loader sets num_mtp_heads to those present
    num_nextn_predict_layers: int = 0
    # GLM-5.3-Flash (glm5_next, inference/models/glm5_next.py): per layer "linear_attention" (KDA)
    # or "indexed_attention" (pooled DSA over MLA without rotary), hyper-connection streams,
    # clamped SwiGLU, where its tensors sit ("model.language_model." in the published checkpoint)
    layer_types: list[str] = field(default_factory=list)
    linear_num_heads: int = 0
    linear_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    linear_lower_bound: float | None = None
    hc_mult: int = 0
    hc_eps: float = 1e-6
    hc_sinkhorn_iters: int = 20
    swiglu_limit: float | None = None
    index_kpool: int = 1
    index_kpool_always_select_tail: bool = False
    checkpoint_prefix: str = "model."

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"unsupported model_type {self.model_type!r}; use one of {MODEL_TYPES}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if (self.sliding_window is None) != (self.global_interval is None):
            raise ValueError("sliding_window and global_interval are set together or not at all")
        if self.sparse and not 0 < self.global_interval <= self.sliding_window:
            # A block must fit in the window so that its node is still cached when elected.
            raise ValueError("need 0 < global_interval <= sliding_window")
        if self.routed and not self.sparse:
            raise ValueError("routed attention needs a sliding_window")
        if self.mlp_layer_types and (
                len(self.mlp_layer_types) != self.num_hidden_layers
                or any(t not in MLP_LAYER_TYPES for t in self.mlp_layer_types)):
            raise ValueError(f"mlp_layer_types needs one of {MLP_LAYER_TYPES} for each of the "
                             f"{self.num_hidden_layers} layers, got {self.mlp_layer_types!r}")
        if "sparse" in self.mlp_layer_types:
            experts, k, groups = self.n_routed_experts, self.num_experts_per_tok, self.n_group
            if not (0 < k <= experts and self.moe_intermediate_size > 0):
                raise ValueError("a Mixture of Experts needs 0 < num_experts_per_tok <= n_routed_experts "
                                 "and moe_intermediate_size > 0")
            if experts % groups or not 0 < self.topk_group <= groups or (groups > 1 and experts // groups < 2):
                raise ValueError("n_routed_experts must split into n_group groups of 2 or more, "
                                 "and 0 < topk_group <= n_group")
            if k > self.topk_group * (experts // groups):
                raise ValueError("num_experts_per_tok is more than the experts of topk_group groups")
        if self.mla:
            if not (self.kv_lora_rank > 0 and self.qk_rope_head_dim > 0 and self.v_head_dim > 0
                    and self.qk_nope_head_dim >= 0 and (self.q_lora_rank is None or self.q_lora_rank > 0)):
                raise ValueError("Multi-head Latent Attention needs kv_lora_rank, qk_rope_head_dim and "
                                 "v_head_dim > 0 (and q_lora_rank > 0 or null)")
            if self.rotary_dim != self.qk_rope_head_dim or self.qk_rope_head_dim % 2:
                raise ValueError("MLA's rotary turns all of an even qk_rope_head_dim: partial_rotary_factor "
                                 "must be 1 and head_dim qk_rope_head_dim")
            if self.sparse:
                raise ValueError("MLA has no sliding-window mode")
        if self.indexer_types:
            if len(self.indexer_types) != self.num_hidden_layers or any(
                    t not in INDEXER_TYPES for t in self.indexer_types) or self.indexer_types[0] != "full":
                raise ValueError(f"indexer_types needs one of {INDEXER_TYPES} for each of the {self.num_hidden_layers} "
                                 f"layers, the first 'full', got {self.indexer_types!r}")
            if not (self.index_topk > 0 and self.index_n_heads > 0 and self.index_head_dim >= self.qk_rope_head_dim
                    and self.q_lora_rank is not None):
                raise ValueError("DeepSeek Sparse Attention needs index_topk, index_n_heads > 0, index_head_dim >= "
                                 "qk_rope_head_dim and a q_lora_rank")
        if self.model_type == "glm5_next":
            from inference.config_glm5_next import validate

            validate(self)
        if self.rope_scaling is not None and self.rope_scaling.get("rope_type", "default") not in ("default", "yarn"):
            raise ValueError(f"unsupported rope_type {self.rope_scaling.get('rope_type')!r}; use default or yarn")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"unsupported quantization {self.quantization!r}; use one of {QUANTIZATIONS}")

    @property
    def sparse(self) -> bool:
        return self.sliding_window is not None

    @property
    def mla(self) -> bool:
        return self.model_type in MLA_TYPES

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_dict(
        cls,
        raw: dict,
        dtype: str | torch.dtype | None = None,
        sliding_window: int | None = None,
        global_interval: int | None = None,
        quantization: str | None = None,
    ) -> ModelConfig:
        """Build from a parsed `config.json`; keyword arguments override the file."""
        model_type = raw.get("model_type")
        next_fields = {}
        if model_type == "glm5_next":  # the text part of a multimodal config, or a flat text one
            from inference.config_glm5_next import text_fields

            raw, next_fields = text_fields(raw)
        rope = raw.get("rope_parameters") or {}
        sparse_default = model_type == "glm5_sparse"
        window = sliding_window or raw.get("sliding_window") or (512 if sparse_default else None)
        interval = global_interval or raw.get("global_interval")
        if window is not None and interval is None:
            interval = 64
        eos = raw.get("eos_token_id")
        hidden = raw["hidden_size"]
        heads = raw["num_attention_heads"]
        moe = _moe_fields(raw) if model_type in MOE_TYPES else {}
        mla = _mla_fields(raw) if model_type in MLA_TYPES else {}
        dsa = _dsa_fields(raw) if model_type in ("glm_moe_dsa", "glm5_next") else {}
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=mla.get("qk_rope_head_dim") or raw.get("head_dim") or hidden // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5 if model_type in MOE_TYPES else 1e-6),
            rope_theta=rope.get("rope_theta", raw.get("rope_theta", 10000.0)),
            partial_rotary_factor=rope.get(
                "partial_rotary_factor", raw.get("partial_rotary_factor", 1.0 if mla else 0.5)
            ),
            max_position_embeddings=raw.get("max_position_embeddings", 131072),
            attention_bias=raw.get("attention_bias", model_type == "glm4"),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            sliding_window=window,
            global_interval=interval,
            routed=model_type == "glm5_sparse" and raw.get("routed", True),
            route_threshold=raw.get("route_threshold", 0.0),
            num_mtp_heads=raw.get("num_mtp_heads", 0) if model_type == "glm5_sparse" else 0,
            eos_token_ids=[] if eos is None else [eos] if isinstance(eos, int) else list(eos),
            dtype=resolve_dtype(dtype or raw.get("dtype") or raw.get("torch_dtype")),
            dtype_given=dtype is not None,
            quantization=quantization or raw.get("quantization"),
            **{**moe, **mla, **dsa, **next_fields},  # MLA's rotary convention over the MoE's
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **overrides) -> ModelConfig:
        """Read `config.json` (and the eos list of `generation_config.json` when present)."""
        model_dir = Path(model_dir)
        raw = json.loads((model_dir / "config.json").read_text())
        gen_path = model_dir / "generation_config.json"
        if gen_path.exists():
            gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
            if gen_eos is not None:
                raw["eos_token_id"] = gen_eos
        return cls.from_dict(raw, **overrides)


def _moe_fields(raw: dict) -> dict:
    """The glm4_moe fields of a `config.json`, with transformers' defaults for `Glm4MoeConfig`
    (`Glm4MoeLiteConfig` shares them)."""
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {raw['hidden_act']!r}; {raw.get('model_type')} uses silu")
    layers = raw["num_hidden_layers"]
    types = raw.get("mlp_layer_types")
    if types is None:
        dense = min(raw.get("first_k_dense_replace", 1), layers)
        types = ["dense"] * dense + ["sparse"] * (layers - dense)
    return {
        "rotary_interleaved": False,
        "use_qk_norm": raw.get("use_qk_norm", False),
        "mlp_layer_types": list(types),
        "n_routed_experts": raw.get("n_routed_experts", raw.get("num_local_experts", 128)),
        "num_experts_per_tok": raw.get("num_experts_per_tok", 8),
        "moe_intermediate_size": raw.get("moe_intermediate_size", 1408),
        "n_shared_experts": raw.get("n_shared_experts", 1),
        "routed_scaling_factor": raw.get("routed_scaling_factor", 1.0),
        "n_group": raw.get("n_group", 1),
        "topk_group": raw.get("topk_group", 1),
        "norm_topk_prob": raw.get("norm_topk_prob", True),
        "num_nextn_predict_layers": raw.get("num_nextn_predict_layers", raw.get("num_mtp_layers", 1)),
    }


def _mla_fields(raw: dict) -> dict:
    """The glm4_moe_lite attention fields of a `config.json`, with `Glm4MoeLiteConfig`'s defaults.
    Its rotary is DeepSeek's interleaved pairs unless `rope_interleave` is false (then halves)."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    scaling = rope.get("rope_type", rope.get("type", "default"))
    return {
        "q_lora_rank": raw.get("q_lora_rank", 768),
        "kv_lora_rank": raw.get("kv_lora_rank", 512),
        "qk_nope_head_dim": raw.get("qk_nope_head_dim", 192),
        "qk_rope_head_dim": raw.get("qk_rope_head_dim", 64),
        "v_head_dim": raw.get("v_head_dim", 256),
        "rotary_interleaved": raw.get("rope_interleave", True),
        "rope_scaling": None if scaling == "default" else {**rope, "rope_type": scaling},
    }


def _dsa_fields(raw: dict) -> dict:
    """glm_moe_dsa's indexer fields, with `GlmMoeDsaConfig`'s defaults: `indexer_types` as given,
    else from `index_topk_pattern` ("F"/"S" letters), else every `index_topk_freq`-th layer from
    `index_skip_topk_offset` on runs its own indexer (all of them by default). Its rotary is
    always DeepSeek's interleaved pairs."""
    layers = raw["num_hidden_layers"]
    types = raw.get("indexer_types")
    if types is None and raw.get("index_topk_pattern") is not None:
        pattern = raw["index_topk_pattern"]
        types = [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    if types is None:
        freq, offset = max(raw.get("index_topk_freq", 1), 1), raw.get("index_skip_topk_offset", 2)
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    return {
        "indexer_types": list(types),
        "index_topk": raw.get("index_topk", 2048),
        "index_n_heads": raw.get("index_n_heads", 32),
        "index_head_dim": raw.get("index_head_dim", 128),
        "rotary_interleaved": True,
    }
