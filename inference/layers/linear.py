"""The one place linear layers are made, and their int8 weight-only (W8A16) replacement."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# oneDNN with a weight reordered once ("prepacked") against `F.linear` (MKL sgemm, which packs
# the weight on every call), fp32 on this 2-core CPU, in microseconds:
#   [4096 x 256]  1 row 115 -> 78,  5 rows 267 -> 96,  8 rows 320 -> 128
#   [1280 x 256]  1 row  50 -> 39,  5 rows 100 -> 43,  8 rows 114 -> 66
# so a decode step and above all a speculative verify forward (k + 1 rows) get cheaper.
_PREPACK = torch.backends.mkldnn.is_available()
_PREPACK_DTYPES = (torch.float32, torch.bfloat16)


def weight_key(w: torch.Tensor) -> tuple[int, int]:
    """What changes when a weight is replaced or modified in place: its storage and version
    (tensors made under inference mode have no version and cannot be modified outside it)."""
    try:
        return w.data_ptr(), w._version
    except RuntimeError:  # an inference tensor
        return w.data_ptr(), 0


class Linear(nn.Linear):
    """A plain dense linear layer (weight `[out, in]`, optional bias), as Hugging Face stores it.

    Inference on CPU (no autograd) runs oneDNN on a reordered copy of the weight, made on the
    first such call and remade when the weight tensor is replaced or bumped in place (its
    storage or version changes). The copy doubles the layer's weight memory; training (autograd
    on) keeps the plain `F.linear`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self._packed: tuple[torch.Tensor, int, int] | None = None  # (weight, data_ptr, version)

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed weight behind (an opaque oneDNN tensor that
        cannot be copied); it is remade on first use."""
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {**state, "_packed": None}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (
            not _PREPACK
            or torch.is_grad_enabled()
            or w.device.type != "cpu"
            or w.dtype not in _PREPACK_DTYPES
            or x.dtype != w.dtype
        ):
            return F.linear(x, w, self.bias)
        packed, key = self._packed, weight_key(w)
        if packed is None or packed[1:] != key:
            packed = self._packed = (torch.ops.mkldnn._reorder_linear_weight(w.detach(), 1), *key)
        return torch.ops.mkldnn._linear_pointwise(x, packed[0], self.bias, "none", [], "")


class PackedLinear(Linear):
    """Linear layers that share their input, stacked into one matrix: one matmul instead of
    several (a decode step is launch-bound for the small k/v projections). The checkpoint keeps
    each part under its own name, a sibling of this module (`parts`: name -> output rows); the
    loader stacks them in order."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)


class Int8Linear(nn.Module):
    """W8A16: int8 weights with one scale per output channel, activations stay bf16/fp16/fp32.

    On CPU the matmul is `aten._weight_int8pack_mm` (bf16 activations; measured 1.6x fp32 decode
    on a 134M model, where dequantize-then-`F.linear` was 8x slower than dense). Elsewhere the
    weight is dequantized per call: correct, not fast.
    """

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight", weight)  # int8 [out, in]
        self.register_buffer("scales", scales)  # [out], the activations' dtype family (bf16 on CPU)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        weight, scales = quantize_weight(linear.weight.detach())
        device = linear.weight.device
        scales = scales.to(torch.bfloat16 if device.type == "cpu" else linear.weight.dtype)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        module = cls(weight, scales, bias)
        if isinstance(linear, PackedLinear):
            module.parts = dict(linear.parts)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.device.type == "cpu":
            out = torch.ops.aten._weight_int8pack_mm(flat.to(torch.bfloat16), self.weight, self.scales)
        else:
            out = F.linear(flat, self.weight.to(flat.dtype)) * self.scales.to(flat.dtype)
        out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: `weight ~ q * scale[:, None]`, q in [-127, 127]."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_linears_(model: nn.Module) -> nn.Module:
    """Replace every `Linear` of `model` by an `Int8Linear` (in place; returns `model`)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear.from_linear(child))
    return model
