"""The weight tensors a plan counts and their bytes per dtype, shared by `inference.plan` and
`inference.plan_glm5_next` (the rules are `inference.plan`'s module docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1 << 30
FP8_BLOCK = 128
DTYPES = ("bf16", "int8", "fp8")

# Tensor kinds: which ones a dtype may quantize (see `inference.plan`'s docstring).
LINEAR = "linear"  # decoder-layer linear weight: int8 and fp8
HEAD = "head"  # lm_head: int8 only
LATENT = "latent"  # MLA's kv_b_proj: fp8 only (the engine keeps it dense under int8)
EMBED = "embed"  # the embedding table: always 2 B, one row read per token
BF16 = "bf16"  # norms, biases, router, DSA indexer: always 2 B
FP32 = "fp32"  # e_score_correction_bias: always 4 B


class PlanError(ValueError):
    """A config this planner cannot read (unknown model type, missing field)."""


@dataclass(frozen=True)
class Tensor:
    """One weight tensor, `copies` times (experts); `active` of them are read per token."""

    name: str
    shape: tuple[int, ...]
    kind: str
    copies: int = 1
    active: int | None = None
    mtp: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape) * self.copies

    @property
    def active_numel(self) -> int:
        copies = self.copies if self.active is None else self.active
        return math.prod(self.shape) * copies


def tensor_bytes(t: Tensor, dtype: str) -> int:
    """Bytes of a tensor (all its copies) in `dtype`, by the rule in the module docstring."""
    numel = math.prod(t.shape)
    quantized = (t.kind == LINEAR or (t.kind == HEAD and dtype == "int8")
                 or (t.kind == LATENT and dtype == "fp8"))
    if t.kind == FP32:
        per_copy = 4 * numel
    elif dtype == "bf16" or not quantized:
        per_copy = 2 * numel
    elif dtype == "int8":
        per_copy = numel + 4 * t.shape[0]
    elif dtype == "fp8":
        rows, cols = t.shape
        per_copy = numel + 4 * math.ceil(rows / FP8_BLOCK) * math.ceil(cols / FP8_BLOCK)
    else:
        raise PlanError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return per_copy * t.copies
