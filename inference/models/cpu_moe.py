"""GLM's routed experts on CPU in fp32 rows: every expert of a layer in one compiled call.

`inference/layers/moe.py` runs the chosen experts one after another, each its gate/up product, a
SiLU, its down product and a scaling: at a decode batch of 16 tokens (top-8 of 64 experts) about
300 torch calls a layer, each a few microseconds of dispatch and Python, around products that
take about as long. `cpu_kernels.c`'s `wecom_moe_experts` does them all in one call and one
OpenMP region, each expert's weights (fp32, or int8 with a scale per row) read once for all its
rows. It serves up to `MAX_ROWS` rows an expert (decode, a speculative verify, small batches);
more (a prefill) are compute-bound and go to torch's matrix products on the same weights.

The kernel reads each weight as the checkpoint stores it, output-major (`[out, in]`): `prepare_`
gives the experts back that layout where the loader stored fp32 weights input-major for MKL, so
that the experts' weights exist once. A plan holds the weights' addresses and is remade when any
expert's module, weight or scales change (`cpu_decode.watch`).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from inference.layers.activation import silu_and_mul
from inference.layers.kernels import cpu_kernels
from inference.layers.linear import Int8Linear, Linear, PackedLinear
from inference.models import cpu_decode

MAX_ROWS = 16  # rows of one expert in one call; past this the products are compute-bound


class _MoeStruct(ctypes.Structure):
    """`wecom_moe` of cpu_kernels.c, field for field."""

    _fields_ = [
        ("experts", ctypes.c_long), ("hidden", ctypes.c_long), ("intermediate", ctypes.c_long),
        ("threads", ctypes.c_int), ("gate_up", ctypes.c_void_p), ("gate_up_scale", ctypes.c_void_p),
        ("down", ctypes.c_void_p), ("down_scale", ctypes.c_void_p),
    ]


class MoePlan:
    """What the kernel reads of a layer's experts, and what it was made from."""

    __slots__ = ("watched", "tensors", "arrays", "struct", "ref", "hidden", "intermediate")

    def __init__(self, tensors: list, arrays: list, struct: _MoeStruct) -> None:
        self.watched: list[tuple] = []
        self.tensors, self.arrays, self.struct = tensors, arrays, struct
        self.ref = ctypes.addressof(struct)
        self.hidden, self.intermediate = struct.hidden, struct.intermediate


def prepare_(moe: nn.Module) -> None:
    """Store the experts' fp32 CPU weights output-major (the checkpoint's layout), in place of
    the input-major copies the loader makes for MKL."""
    for expert in moe.experts:
        for linear in (expert.gate_up_proj, expert.down_proj):
            w = linear.weight
            if type(linear) in (Linear, PackedLinear) and w.dtype == torch.float32 and not w.is_contiguous():
                linear.weight = nn.Parameter(w.detach().contiguous(), requires_grad=w.requires_grad)


def _weight(linear) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(rows `[out, in]` as the kernel reads them, fp32 scales for int8 or None), or None."""
    if linear.bias is not None:
        return None
    w = linear.weight
    if type(linear) is Int8Linear:
        if w.dtype != torch.int8 or w.device.type != "cpu" or not w.is_contiguous():
            return None
        return w, linear.fp32_scales_and_bias()[0]
    if type(linear) in (Linear, PackedLinear) and w.dtype == torch.float32 and w.device.type == "cpu" \
            and w.is_contiguous():
        return w, None
    return None


def plan(moe: nn.Module) -> MoePlan | None:
    """The plan of `moe`'s experts, remade when they changed; None where the kernel cannot serve
    them (no kernels here, other dtypes or devices, biases)."""
    cached = moe.__dict__.get("_cpu_moe_plan")
    if cached is not None and cpu_decode.holds(cached.watched):
        return cached
    moe.__dict__.pop("_cpu_moe_plan", None)
    if not cpu_kernels.available():
        return None
    parts = [(_weight(e.gate_up_proj), _weight(e.down_proj)) for e in moe.experts]
    if any(g is None or d is None for g, d in parts):
        return None
    (gate_up, _), (down, _) = parts[0]
    hidden, intermediate = gate_up.shape[1], down.shape[1]
    if any(g[0].shape != (2 * intermediate, hidden) or d[0].shape != (hidden, intermediate) for g, d in parts):
        return None
    count = len(parts)
    pointers = ctypes.c_void_p * count
    gate_ups, downs = pointers(*[g[0].data_ptr() for g, _ in parts]), pointers(*[d[0].data_ptr() for _, d in parts])
    int8 = any(g[1] is not None or d[1] is not None for g, d in parts)
    gate_scales = pointers(*[None if g[1] is None else g[1].data_ptr() for g, _ in parts]) if int8 else None
    down_scales = pointers(*[None if d[1] is None else d[1].data_ptr() for _, d in parts]) if int8 else None
    struct = _MoeStruct(
        experts=count, hidden=hidden, intermediate=intermediate, threads=torch.get_num_threads(),
        gate_up=ctypes.addressof(gate_ups), down=ctypes.addressof(downs),
        gate_up_scale=None if gate_scales is None else ctypes.addressof(gate_scales),
        down_scale=None if down_scales is None else ctypes.addressof(down_scales),
    )
    tensors = [t for pair in parts for part in pair for t in part if t is not None]
    made = MoePlan(tensors, [gate_ups, downs, gate_scales, down_scales], struct)
    entries = [(moe, "experts")]
    for i, expert in enumerate(moe.experts):
        entries += [(moe.experts, str(i)), (expert, "gate_up_proj"), (expert, "down_proj")]
        for linear in (expert.gate_up_proj, expert.down_proj):
            entries += [(linear, "weight"), (linear, "bias")]
            if type(linear) is Int8Linear:
                entries.append((linear, "scales"))
    made.watched = cpu_decode.watch(entries)
    moe.__dict__["_cpu_moe_plan"] = made
    return made


def run(made: MoePlan, counts: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """weight * expert(row) for `rows [P, hidden]` sorted by expert (`counts [experts]` int64, each
    at most `MAX_ROWS`) and their routing `weights [P]` fp32."""
    made.struct.threads = torch.get_num_threads()
    rows, weights, counts = rows.contiguous(), weights.contiguous(), counts.contiguous()
    out = torch.empty_like(rows)
    scratch = torch.empty(rows.shape[0] * 3 * made.intermediate)
    cpu_kernels.library().wecom_moe_experts(made.ref, counts.data_ptr(), rows.data_ptr(), weights.data_ptr(),
                                            out.data_ptr(), scratch.data_ptr())
    return out


def by_torch(moe: nn.Module, counts: list[int], rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`run` for many rows an expert (a prefill): torch's products on the same output-major
    weights (`F.linear` reads them in place; an int8 expert runs its own layers)."""
    out, start = torch.empty_like(rows), 0
    for expert, count in zip(moe.experts, counts, strict=True):
        if count:
            x = rows[start : start + count]
            if type(expert.gate_up_proj) is Int8Linear or type(expert.down_proj) is Int8Linear:
                out[start : start + count] = expert(x)
            else:
                out[start : start + count] = F.linear(silu_and_mul(F.linear(x, expert.gate_up_proj.weight)),
                                                      expert.down_proj.weight)
            start += count
    return out * weights[:, None]
