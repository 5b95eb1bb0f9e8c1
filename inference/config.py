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

MODEL_TYPES = ("glm5_sparse", "glm4")
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
    quantization: str | None = None  # "w8a16": int8 weight-only linear layers

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
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"unsupported quantization {self.quantization!r}; use one of {QUANTIZATIONS}")

    @property
    def sparse(self) -> bool:
        return self.sliding_window is not None

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
        rope = raw.get("rope_parameters") or {}
        sparse_default = model_type == "glm5_sparse"
        window = sliding_window or raw.get("sliding_window") or (512 if sparse_default else None)
        interval = global_interval or raw.get("global_interval")
        if window is not None and interval is None:
            interval = 64
        eos = raw.get("eos_token_id")
        hidden = raw["hidden_size"]
        heads = raw["num_attention_heads"]
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or hidden // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", raw.get("rope_theta", 10000.0)),
            partial_rotary_factor=rope.get(
                "partial_rotary_factor", raw.get("partial_rotary_factor", 0.5)
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
            quantization=quantization or raw.get("quantization"),
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
