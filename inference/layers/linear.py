"""The one place linear layers are made, and their int8 weight-only (W8A16) replacement."""

from __future__ import annotations

import os
import time
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from inference.layers.kernels import cpu_kernels, w8a16_triton

# Batch-1 decode on CPU is a matrix-vector product per layer, bound by reading the weight; a
# speculative verify or a small continuous batch is a matmul of a few rows. Which fp32 kernel is
# fastest depends on the CPU: MKL on the weight stored input-major (`[in, out]` in memory, what
# `w.t().contiguous()` holds) or oneDNN on a copy packed once. Measured:
#   2-core AMD EPYC, AVX2 only (all linears of a 132M GLM-4, weights cold, in ms):
#                 1 row   5 rows   8 rows   64 rows
#   MKL [out, in] 16.3    30.8     40.6     71.8
#   MKL [in, out] 14.7    27.1     29.7     69.2
#   oneDNN packed 19.5    26.6     28.8     62.9      (7M demo: 0.36 / 0.44 / 0.49 / 1.89 ms MKL
#                                                      against oneDNN's 0.75 / 1.09 / 1.13 / 2.48)
#   2-core AMD EPYC with AVX-512 (one 4096x256 lm head / one 1280x256 projection, warm, in us):
#                 1 row   2 rows   5 rows   9 rows   20 rows
#   MKL [in, out] 70/23   149/48   291/66   399/97   424/138
#   oneDNN packed 55/28    63/27    82/38   109/49   239/81
# So the loader stores fp32 CPU weights input-major (same shape, same values, other strides, no
# extra memory), and `Fp32Matmul` measures both kernels the first time it meets a weight shape
# and a row bucket, and keeps the faster (a packed copy only where oneDNN won). oneDNN gave a
# row the same bits whatever the number of rows beside it (MKL did not), so where it serves both
# one row and a few, a speculative verify computes exactly the logits plain decoding does.
# 1-8 rows (decode, verify, small batches) go to neither where this machine can build
# `cpu_kernels` (a plain streaming loop on an output-major copy, each weight read once for all
# the rows): inside a decode step it kept ahead of both (figures in
# inference/layers/kernels/cpu_kernels.py). Its rows too get the same bits whatever the rows beside them.
# bf16 is the other way round: `F.linear` reorders the weight for oneDNN on every call, so a copy
# packed once is faster (demo model 447 vs 383 tok/s). oneDNN's bf16 reorder needs avx512 (bf16)
# or avx_ne_convert: on an AVX2-only CPU bf16 weights go to F.linear as they are.
_MKLDNN_BF16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
# "auto" (measure), or "mkl" / "onednn" to pin every fp32 CPU linear to one kernel
FP32_MATMUL = os.environ.get("INFERENCE_FP32_MATMUL", "auto")
# A packed oneDNN copy, or the output-major copy `cpu_kernels` reads, is a second copy of the weight:
# past this many bytes of them in a process, the rest of the weights stay on MKL (a large fp32
# model on CPU would otherwise double).
FP32_PACKED_MAX_BYTES = int(os.environ.get("INFERENCE_FP32_PACKED_MAX_BYTES", 1 << 30))


def input_major(w: torch.Tensor) -> torch.Tensor:
    """`w` ([out, in]) with its storage laid out as `[in, out]`: the view `F.linear` reads fastest
    on CPU in fp32."""
    return w if w.t().is_contiguous() else w.t().contiguous().t()


def onednn_packed(w: torch.Tensor, rows: int = 1) -> torch.Tensor:
    """`w` reordered once for oneDNN (an opaque tensor for `mkldnn._linear_pointwise`), laid out
    for about `rows` input rows (a layout for 1 row is slow at 2 and more; one for 5 is not
    slower at 1)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), rows)


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

    Inference on CPU (no autograd) runs an input-major fp32 weight through `Fp32Matmul` and a
    bf16 weight packed for oneDNN. The loader stores fp32 weights input-major already; any other
    weight gets its CPU copy on the first such call, remade when the weight's storage or version
    changes (a bf16 model thus holds its weights twice). Training (autograd on) uses the weight
    as it is.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self._copy: tuple[torch.Tensor, int, int] | None = None  # (CPU weight, data_ptr, version)
        # once the weight is found input-major: inference calls the chosen kernel directly, one
        # dispatch instead of F.linear's four (linear, t, matmul, mm), 49 calls a decode step on
        # GLM-4
        self._fp32: Fp32Matmul | None = None

    def __getstate__(self) -> dict:
        """Copies and pickles leave the CPU copy behind (a packed one is an opaque oneDNN tensor
        that cannot be copied); it is remade on first use."""
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {**state, "_copy": None, "_fp32": None}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, fast = self.weight, self._fp32
        if fast is not None and fast.follows(w, self.bias) and not torch.is_grad_enabled():
            return fast(x) if x.dim() == 2 else fast(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        if torch.is_grad_enabled() or w.device.type != "cpu" or x.dtype != w.dtype:
            return F.linear(x, w, self.bias)
        if w.dtype == torch.float32:
            if w.t().is_contiguous():
                # strides cannot change in place: only a new weight (or bias) leaves this
                self._fp32 = Fp32Matmul(w, self.bias)
                return self.forward(x)
            if x.dim() == 2 and x.shape[0] <= 8 and FP32_MATMUL == "auto" and _kernel_reads(w, self.bias):
                return cpu_kernels.matmul(x, w, self.bias)  # an output-major weight: as it is
            return F.linear(x, self._cpu_weight(w, input_major), self.bias)
        if w.dtype == torch.bfloat16 and _MKLDNN_BF16:
            packed = self._cpu_weight(w, onednn_packed)
            return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
        return F.linear(x, w, self.bias)

    def output_major(self) -> torch.Tensor | None:
        """For an fp32 CPU weight under inference, the output-major layout the fused CPU decode
        layer reads: the weight itself where it is stored so, else the copy `Fp32Matmul.rows`
        keeps of an input-major one; otherwise None."""
        w, fast = self.weight, self._fp32
        if w.dtype == torch.float32 and w.device.type == "cpu" and w.is_contiguous():
            return w  # output-major already (a model built in code rather than loaded)
        if fast is None or not fast.follows(w, self.bias):
            if w.dtype != torch.float32 or w.device.type != "cpu" or not w.t().is_contiguous():
                return None
            fast = self._fp32 = Fp32Matmul(w, self.bias)
        return fast.rows()

    def _cpu_weight(self, w: torch.Tensor, make) -> torch.Tensor:
        copy, key = self._copy, weight_key(w)
        if copy is None or copy[1:] != key:
            copy = self._copy = (make(w.detach()), *key)
        return copy[0]


def _plain_bias(bias: torch.Tensor | None) -> bool:
    """A bias `cpu_kernels.matmul` reads as it is (or none)."""
    return bias is None or (bias.dtype == torch.float32 and bias.is_contiguous() and bias.dim() == 1)


def _kernel_reads(w: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `cpu_kernels.matmul` can take this output-major weight and bias as they are."""
    return w.is_contiguous() and _plain_bias(bias) and cpu_kernels.available()


_ONEDNN = torch.backends.mkldnn.is_available()
# (weight shape, has bias, row bucket) -> "mkl" | "onednn": measured once per process and shape
_CHOICES: dict[tuple, str] = {}
_PACKED: weakref.WeakSet = weakref.WeakSet()  # the Fp32Matmuls that keep a copy of their weight


def packed_bytes() -> int:
    """Bytes of the weight copies (packed for oneDNN, output-major for `cpu_kernels`) alive in this
    process."""
    return sum(
        m.weight.numel() * m.weight.element_size() * ((m._packed is not None) + (m._rows is not None))
        for m in list(_PACKED)
    )


def _row_bucket(rows: int) -> int:
    """Row counts that behave alike: 1 (decode), 2-8 (verify, small batches), 9-64, more (prefill)."""
    return 0 if rows == 1 else 1 if rows <= 8 else 2 if rows <= 64 else 3


class Fp32Matmul:
    """`x @ weight.t() + bias` on CPU in fp32 for an input-major `weight`, with the faster of MKL
    (`mm`/`addmm` on the `[in, out]` view) and oneDNN (a copy packed once) for each row bucket,
    measured on the first input of that bucket (see the figures above), and `cpu_kernels` for 1-8
    rows where it is built. All are exact fp32 matmuls; they differ only in summation order. A copy
    follows in-place changes of the weight (its storage and version) and exists only while its
    kernel serves some bucket."""

    __slots__ = ("weight", "bias", "_t", "_ptr", "_packed", "_packed_key", "_rows", "_rows_key", "_calls",
                 "__weakref__")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias, self._t, self._ptr = weight, bias, weight.t(), weight.data_ptr()
        self._packed: torch.Tensor | None = None
        self._packed_key: tuple[int, int] | None = None
        self._rows: torch.Tensor | None = None  # output-major copy for cpu_kernels
        self._rows_key: tuple[int, int] | None = None
        self._calls: list = [None] * 4

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        bucket = _row_bucket(x.shape[0])
        call = self._calls[bucket]
        if call is None:
            call = self._calls[bucket] = self._choose(x, bucket)
        return call(x)

    def follows(self, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """Whether this still serves `weight` and `bias`: the same objects, the weight on the
        same memory (`param.data = t` keeps the object; the `[in, out]` view would not follow)."""
        return self.weight is weight and self.bias is bias and self._ptr == weight.data_ptr()

    def mkl(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self._t) if self.bias is None else torch.addmm(self.bias, x, self._t)

    def onednn(self, x: torch.Tensor) -> torch.Tensor:
        key = weight_key(self.weight)
        if key != self._packed_key:
            self._packed, self._packed_key = onednn_packed(self.weight.detach(), 5), key
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def few_rows(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.rows() if x.dtype == torch.float32 else None
        if rows is None:  # ctypes reads raw memory: other dtypes get torch's own error
            return self.mkl(x)
        return cpu_kernels.matmul(x, rows, self.bias)

    def rows(self) -> torch.Tensor | None:
        """The output-major copy of the weight that `cpu_kernels` reads, remade when the weight
        changes; None when a new one would pass the copy cap."""
        key = weight_key(self.weight)
        if key != self._rows_key:
            if self._rows is None and not self._fits():
                return None
            self._rows, self._rows_key = self.weight.detach().contiguous(), key
            _PACKED.add(self)
        return self._rows

    def _choose(self, x: torch.Tensor, bucket: int):
        if bucket <= 1 and FP32_MATMUL == "auto" and self._kernel_serves():
            return self.few_rows
        key = (tuple(self.weight.shape), self.bias is not None, bucket)
        choice = FP32_MATMUL if FP32_MATMUL != "auto" else _CHOICES.get(key)
        if choice is None:
            choice = _CHOICES[key] = _faster({"mkl": self.mkl, "onednn": self.onednn}, x) if _ONEDNN else "mkl"
        # a prefill's packed copy leaves room for the copy the decode rows will want (first come
        # is the prefill; without this its packs could take the whole cap from the hot path)
        reserve = 2 if self._rows is None and FP32_MATMUL == "auto" and cpu_kernels.available() else 1
        if choice == "onednn" and (self._packed is not None or self._fits(reserve)):
            _PACKED.add(self)
            return self.onednn
        if self.onednn not in self._calls:
            self._packed = self._packed_key = None  # measured and lost (or over the cap): no copy kept
            if self._rows is None:
                _PACKED.discard(self)
        return self.mkl

    def _kernel_serves(self) -> bool:
        """Whether up to 8 rows go to `cpu_kernels`: built here, a plain fp32 bias, and room for
        the output-major copy under the cap."""
        return _plain_bias(self.bias) and cpu_kernels.available() and (self._rows is not None or self._fits())

    def _fits(self, copies: int = 1) -> bool:
        """Whether `copies` more copies of this weight stay within `FP32_PACKED_MAX_BYTES`."""
        return packed_bytes() + copies * self.weight.numel() * self.weight.element_size() <= FP32_PACKED_MAX_BYTES


def _faster(kernels: dict, x: torch.Tensor, budget_s: float = 2e-3) -> str:
    """The name of the kernel that ran `x` fastest: each warmed up once, then timed in turns
    (best of three rounds of about `budget_s / 6` each), so that a burst of load from elsewhere
    hits both alike."""
    start = time.perf_counter()
    for kernel in kernels.values():
        kernel(x)
    reps = max(1, min(50, int(budget_s / 2 / max(time.perf_counter() - start, 1e-6))))
    best = dict.fromkeys(kernels, float("inf"))
    for _ in range(3):
        for name, kernel in kernels.items():
            t = time.perf_counter()
            for _ in range(reps):
                kernel(x)
            best[name] = min(best[name], time.perf_counter() - t)
    return min(best, key=best.get)


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

    On CPU up to `INT8_KERNEL_ROWS` fp32 rows (decode, verify, small batches) go to
    `cpu_kernels.matmul_int8` where it is built: the int8 weight read once for all rows and
    widened in registers, fp32 sums, the scale applied once per output (it keeps fp32 copies of
    the scales and bias). Other CPU rows take `aten._weight_int8pack_mm` (bf16 activations;
    measured 1.6x fp32 decode on a 134M model, where dequantize-then-`F.linear` was 8x slower
    than dense). On CUDA a few rows (decode, verify) go to a Triton kernel that dequantizes in
    registers (`w8a16_triton`); many rows, or a GPU without triton, dequantize per call and use
    cuBLAS.
    """

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight", weight)  # int8 [out, in]
        self.register_buffer("scales", scales)  # [out], the activations' dtype family (bf16 on CPU)
        self.register_buffer("bias", bias)
        self._fp32: tuple | None = None  # ((scales key, bias key), fp32 scales, fp32 bias) for the CPU kernel

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fp32": None}

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
        if (x.dtype == torch.float32 and x.dim() == 2 and x.shape[0] <= INT8_KERNEL_ROWS and x.is_cpu
                and self.weight.is_contiguous() and cpu_kernels.available()):
            scales, bias = self.fp32_scales_and_bias()
            return cpu_kernels.matmul_int8(x, self.weight, scales, bias)
        if x.is_cpu and self.in_features % 16:
            # torch's CPU int8 matmul assumes K a multiple of 16: past it, it read out of bounds
            # (garbage at 1 row, a segfault at 17; torch 2.13)
            w = self.weight.to(x.dtype) * self.scales.to(x.dtype)[:, None]
            return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))
        if x.is_cpu and x.dim() == 2:  # decode and verify rows: as few dispatches as can be
            # (a demo-model linear is ~8 us of kernel; each cast or check costs 1-4 us more)
            out = _INT8_MM(x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16), self.weight, self.scales)
            if x.dtype != torch.bfloat16:
                out = out.to(x.dtype)
            return out if self.bias is None else out.add_(self.bias.to(x.dtype))
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if flat.device.type == "cpu":
            out = _INT8_MM(flat.to(torch.bfloat16), self.weight, self.scales)
        elif w8a16_triton.usable(flat):  # a few rows on CUDA: the int8 weight read once
            out = w8a16_triton.matmul(flat, self.weight, self.scales, self.bias)
            return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)
        else:  # many rows (compute-bound): one dequantized copy, then cuBLAS
            out = F.linear(flat, self.weight.to(flat.dtype)) * self.scales.to(flat.dtype)
        out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)


    def fp32_scales_and_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The scales and bias as the CPU kernel reads them (fp32, contiguous), remade when
        either changes (its storage or version)."""
        scales, bias = self.scales, self.bias
        key = (weight_key(scales), None if bias is None else weight_key(bias))
        made = self._fp32
        if made is None or made[0] != key:
            plain = lambda t: None if t is None else t.detach().float().contiguous()  # noqa: E731
            made = self._fp32 = (key, plain(scales), plain(bias))
        return made[1], made[2]


# fp32 rows up to this many go to the compiled int8 kernel on CPU (each weight read once for all)
INT8_KERNEL_ROWS = 16


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
