"""The one place linear layers are made, and their int8 weight-only (W8A16) replacement."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Batch-1 decode on CPU is a matrix-vector product per layer, bound by reading the weight.
# In fp32, MKL reads a weight stored input-major (`[in, out]` in memory, what
# `w.t().contiguous()` holds) faster than the checkpoint's `[out, in]` or a oneDNN-packed copy;
# all linears of a 132M GLM-4 (418 MiB, weights cold in cache) on this 2-core CPU, in ms:
#                 1 row   5 rows   8 rows   64 rows
#   [out, in]     16.3    30.8     40.6     71.8
#   [in, out]     14.7    27.1     29.7     69.2
#   oneDNN packed 19.5    26.6     28.8     62.9
# and the 7M demo model 0.36 / 0.44 / 0.49 / 1.89 against oneDNN's 0.75 / 1.09 / 1.13 / 2.48.
# The loader therefore stores fp32 CPU weights input-major (`input_major`): same shape, same
# values, other strides, no extra memory. bf16 is the other way round: `F.linear` reorders the
# weight for oneDNN on every call, so a copy packed once is faster (demo model 447 vs 383 tok/s).
# oneDNN's bf16 reorder needs avx512 (bf16) or avx_ne_convert: on an AVX2-only CPU bf16 weights
# go to F.linear as they are.
_MKLDNN_BF16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def input_major(w: torch.Tensor) -> torch.Tensor:
    """`w` ([out, in]) with its storage laid out as `[in, out]`: the view `F.linear` reads fastest
    on CPU in fp32."""
    return w if w.t().is_contiguous() else w.t().contiguous().t()


def onednn_packed(w: torch.Tensor) -> torch.Tensor:
    """`w` reordered once for oneDNN (an opaque tensor for `mkldnn._linear_pointwise`)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 1)


def weight_key(w: torch.Tensor) -> tuple[int, int]:
    """What changes when a weight is replaced or modified in place: its storage and version
    (tensors made under inference mode have no version and cannot be modified outside it).
    Asked, not tried: the int8 draft copies are inference tensors, and the exception that
    `_version` raises for them cost ~30 us a call, twice per MTP layer per draft depth."""
    if w.is_inference():
        return w.data_ptr(), 0
    return w.data_ptr(), w._version


class Linear(nn.Linear):
    """A plain dense linear layer (weight `[out, in]`, optional bias), as Hugging Face stores it.

    Inference on CPU (no autograd) reads an fp32 weight input-major and a bf16 weight packed for
    oneDNN. The loader stores fp32 weights input-major already; any other weight gets its CPU
    copy on the first such call, remade when the weight's storage or version changes (a bf16
    model thus holds its weights twice). Training (autograd on) uses the weight as it is.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self._copy: tuple[torch.Tensor, int, int] | None = None  # (CPU weight, data_ptr, version)
        # (weight, weight.t()) once the weight is found input-major: inference goes straight to
        # mm/addmm on the `[in, out]` view, one dispatch instead of F.linear's four (linear, t,
        # matmul, mm; the same kernel, the same result), 49 calls a decode step on GLM-4
        self._direct: tuple[torch.Tensor, torch.Tensor] | None = None

    def __getstate__(self) -> dict:
        """Copies and pickles leave the CPU copy behind (a packed one is an opaque oneDNN tensor
        that cannot be copied); it is remade on first use."""
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {**state, "_copy": None, "_direct": None}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, direct = self.weight, self._direct
        if direct is not None and direct[0] is w and x.dim() == 2 and not torch.is_grad_enabled():
            return torch.mm(x, direct[1]) if self.bias is None else torch.addmm(self.bias, x, direct[1])
        if torch.is_grad_enabled() or w.device.type != "cpu" or x.dtype != w.dtype:
            return F.linear(x, w, self.bias)
        if w.dtype == torch.float32:
            if w.t().is_contiguous():
                # strides cannot change in place: only a new weight leaves this
                self._direct = (w, w.t())
                return F.linear(x, w, self.bias)
            return F.linear(x, self._cpu_weight(w, input_major), self.bias)
        if w.dtype == torch.bfloat16 and _MKLDNN_BF16:
            packed = self._cpu_weight(w, onednn_packed)
            return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
        return F.linear(x, w, self.bias)

    def _cpu_weight(self, w: torch.Tensor, make) -> torch.Tensor:
        copy, key = self._copy, weight_key(w)
        if copy is None or copy[1:] != key:
            copy = self._copy = (make(w.detach()), *key)
        return copy[0]


class PackedLinear(Linear):
    """Linear layers that share their input, stacked into one matrix: one matmul instead of
    several (a decode step is launch-bound for the small k/v projections). The checkpoint keeps
    each part under its own name, a sibling of this module (`parts`: name -> output rows); the
    loader stacks them in order."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)


_INT8_MM = torch.ops.aten._weight_int8pack_mm  # looked up once: a draft depth makes six calls


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
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)  # decode rows are 2-D already
        if flat.device.type == "cpu":
            out = _INT8_MM(flat.to(torch.bfloat16), self.weight, self.scales)
        else:
            out = F.linear(flat, self.weight.to(flat.dtype)) * self.scales.to(flat.dtype)
        out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: `weight ~ q * scale[:, None]`, q in [-127, 127]."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return q, scales


def quantize_linears_(model: nn.Module) -> nn.Module:
    """Replace every `Linear` of `model` by an `Int8Linear` (in place; returns `model`)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear.from_linear(child))
    return model
