"""A few decode rows through a decoder layer on CPU (fp32 rows, fp32 or int8 weights): compiled calls.

At batch 1 a layer is four matrix-vector products and ~45 small torch ops; the products are bound
by reading the weights, the small ops by dispatch and Python, and they ran on caches that each
weight stream had just emptied (1.5 ms of a 10 ms step warm, 3-5 ms between the streams, on the
132M GLM-4 of bench.engine). `cpu_kernels.c`'s `wecom_layer_pre` does the input norm, the q/k/v
(and router) projection, rotary and the node norm; `wecom_layer_post` the output projection,
GLM-4's sandwich norms, both residuals and the MLP. The attention between them is the layer's
own (`LayerCache.extend` + `sparse_attention`, or the serving engine's paged `attend`).

One row of a single sequence (a `LayerCache`: plain decoding, an MTP draft) takes one call instead,
`wecom_layer_decode`: the same two halves with the cache append and the attention of one query
between them, in C (the attention and the cache update were ~0.3 ms of Python and ATen a step).
`LayerCache` keeps its bookkeeping: it says where the row's key, value and node norm go
(`row_slots`) and elects nodes and counts the row afterwards (`row_appended`); the kernel writes
them, saves what the ring slot held in the undo log, and attends to the window and the valid
nodes exactly as `sparse_attention` does for one query (one softmax over both, or in routed mode
the two paths weighted by the router's thresholded softmax, a path of weight 0 skipped). A whole
model's step does the same for all its layers in one call (`inference/models/cpu_step.py`).
Several rows of a single sequence (a speculative verify, an MTP depth catching up on the tokens
just accepted) take `wecom_layer_decode_rows`: the two halves over all rows (each weight read once
for them) with each row appended and attending in turn between them, as that many one-row calls
would (`LayerCache.rows_slots`, `rows_appended`); their torch attention and cache writes had cost
~0.07 ms a layer call on the demo model.

Taken for up to `MAX_ROWS` rows (a decode step, a speculative verify, a small continuous batch;
each weight is read once for all of them) when the kernels are built here, autograd is off, the
rows are fp32 on the CPU and every matmul of the layer is a dense fp32 `Linear` or an int8
`Int8Linear` (W8A16; a routed layer's q/k/v and router both one or the other) with no bias
outside q/k/v; anything else runs the torch layers. The plan holds the layer's weights as the
kernels read them (output-major: a weight stored so is read in place, an input-major one, as the
loader stores them, through the copy `Fp32Matmul.rows` keeps within its cap; int8 weights in
place with fp32 copies of their scales; the norm weights in place) and is remade when any of
them changes. Module hooks on the layer's sub-modules do not
run on this path.
"""

from __future__ import annotations

import ctypes
import weakref

import torch

from inference.layers.attention import sparse_attention
from inference.layers.caches.gqa_sequence import LayerCache
from inference.layers.kernels import cpu_kernels
from inference.layers.linear import Int8Linear, Linear, PackedLinear
from inference.layers.norm import RMSNorm

MAX_ROWS = 16  # past this a chunk is a prefill: compute-bound, where oneDNN's blocking wins


class _LayerStruct(ctypes.Structure):
    """`wecom_layer` of cpu_kernels.c, field for field."""

    _fields_ = [
        ("hidden", ctypes.c_long), ("heads", ctypes.c_long), ("kv_heads", ctypes.c_long),
        ("head_dim", ctypes.c_long), ("rotary_dim", ctypes.c_long), ("intermediate", ctypes.c_long),
        ("proj_rows", ctypes.c_long), ("eps", ctypes.c_float), ("threads", ctypes.c_int),
        ("input_norm", ctypes.c_void_p), ("proj", ctypes.c_void_p), ("proj_bias", ctypes.c_void_p),
        ("o_proj", ctypes.c_void_p), ("post_attn_norm", ctypes.c_void_p), ("pre_mlp_norm", ctypes.c_void_p),
        ("gate_up", ctypes.c_void_p), ("down", ctypes.c_void_p), ("post_mlp_norm", ctypes.c_void_p),
        ("routed", ctypes.c_int), ("route_threshold", ctypes.c_float),
        ("proj_scale", ctypes.c_void_p), ("o_proj_scale", ctypes.c_void_p), ("gate_up_scale", ctypes.c_void_p),
        ("down_scale", ctypes.c_void_p),
    ]


class KvRowStruct(ctypes.Structure):
    """`wecom_kv_row` of cpu_kernels.c: where one decode row goes in a `LayerCache`, and what it
    attends to."""

    _fields_ = [
        ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("slots", ctypes.c_long), ("slot", ctypes.c_long),
        ("undo_k", ctypes.c_void_p), ("undo_v", ctypes.c_void_p), ("undo_slots", ctypes.c_long),
        ("undo_slot", ctypes.c_long), ("norm_log", ctypes.c_void_p), ("block_norm", ctypes.c_void_p),
        ("local", ctypes.c_long), ("nodes", ctypes.c_long),
    ]


class Plan:
    """What the kernels read for one layer, and what it was made from (to notice changes)."""

    __slots__ = ("watched", "tensors", "struct", "ref", "qkv_cols", "routed", "hidden", "intermediate")

    def __init__(self, tensors: list[torch.Tensor], struct: _LayerStruct, qkv_cols: int, routed: bool) -> None:
        self.watched: list[tuple] = []
        self.tensors, self.struct, self.qkv_cols, self.routed = tensors, struct, qkv_cols, routed
        self.ref = ctypes.addressof(struct)
        self.hidden, self.intermediate = struct.hidden, struct.intermediate

    def still_holds(self) -> bool:
        """Whether every module and tensor it was made from is still in place and unmodified: the
        same objects (`is`), tensors on the same memory at the same version (inference tensors
        have none). About two dozen lookups (~1.6 us), against the ~50 us a call that re-deriving
        the plan cost."""
        return holds(self.watched)


def _watch(layer) -> list[tuple]:
    """(holder, the dict that holds it, attribute, value, version, data pointer) of every module
    and tensor a plan of `layer` is made from: nn.Module keeps parameters and sub-modules in dicts
    of their own, and a lookup there is a fraction of `getattr`'s cost. A plain attribute (a router that
    is None) is looked up with `getattr`: assigning a module to it moves it to another dict."""
    attn, mlp = layer.self_attn, layer.mlp
    entries = [(layer, "self_attn"), (layer, "mlp"), (layer, "router"), (attn, "qkv_proj"), (attn, "o_proj"),
               (mlp, "gate_up_proj"), (mlp, "down_proj")]
    linears = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
    if layer.router is not None:
        linears.append(layer.router)
        entries.append((layer, "route_threshold"))  # the one-row kernel applies it
    entries += [(m, name) for m in linears for name in ("weight", "bias")]
    entries += [(m, "scales") for m in linears if type(m) is Int8Linear]
    for name in ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"):
        norm = getattr(layer, name, None)
        if norm is not None:
            entries += [(layer, name), (norm, "weight")]
    return watch(entries)


def watch(entries: list[tuple]) -> list[tuple]:
    """The `Plan.watched` entries of `(holder, attribute)` pairs, as they are now."""
    watched = []
    for holder, name in entries:
        value = getattr(holder, name)
        dicts = [getattr(holder, d, {}) for d in ("_parameters", "_modules", "_buffers")]
        where = next((d for d in dicts if name in d), None)
        tensor = isinstance(value, torch.Tensor)
        version = value._version if tensor and not value.is_inference() else None
        watched.append((holder, where, name, value, version, value.data_ptr() if tensor else None))
    return watched


def holds(watched: list[tuple]) -> bool:
    """Whether every entry of `watched` is still the same object (`is`), a tensor at the same
    version and on the same memory (`param.data = t` keeps the object and its version)."""
    for holder, where, name, value, version, ptr in watched:
        current = where.get(name) if where is not None else getattr(holder, name, None)
        if current is not value:
            return False
        if ptr is not None and (current.data_ptr() != ptr or (version is not None and current._version != version)):
            return False
    return True


def norm_weight(norm) -> torch.Tensor | None:
    """An fp32 `RMSNorm`'s weight as the kernels read it, or None."""
    w = getattr(norm, "weight", None)
    if not isinstance(norm, RMSNorm) or w.dtype != torch.float32 or w.device.type != "cpu" or not w.is_contiguous():
        return None
    return w


def _parts(layer) -> tuple[list, tuple] | None:
    """The layer's projection Linear (q/k/v, fused with the router when routed), its other three
    Linears and its norms; None when the layer is not one this path serves (the fast path is
    installed only on the layer types whose parts these are, but a plan may be asked of any)."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if not all(hasattr(attn, n) for n in ("qkv_proj", "o_proj")) or not all(
            hasattr(mlp, n) for n in ("gate_up_proj", "down_proj")) or not hasattr(layer, "router"):
        return None
    if getattr(attn, "q_norm", None) is not None or not getattr(attn, "rotary_interleaved", True):
        return None  # the kernels rotate pairs and have no q/k norms
    dense, kinds = (Linear, PackedLinear), (Linear, PackedLinear, Int8Linear)
    if not all(type(m) in kinds for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)):
        return None
    proj = attn.qkv_proj
    if layer.router is not None:  # fused with the router, as `qkv_and_gate` runs it
        if type(proj) in dense and type(layer.router) in dense:
            proj = layer.fused_projection()
        elif type(proj) is Int8Linear and type(layer.router) is Int8Linear:
            proj = layer.fused_int8()
        else:
            return None
    linears = [proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
    if any(m.bias is not None for m in linears[1:]):
        return None
    norms = [layer.input_layernorm, getattr(layer, "post_self_attn_layernorm", None),
             layer.post_attention_layernorm, getattr(layer, "post_mlp_layernorm", None)]
    return linears, norms


def plan(layer, h: torch.Tensor) -> Plan | None:
    """The layer's plan for the rows `h`, or None where the torch layers must run."""
    if h.dim() != 2 or h.shape[0] > MAX_ROWS or h.dtype != torch.float32 or h.device.type != "cpu" or torch.is_grad_enabled():
        return None
    made = layer_plan(layer)
    return made if made is not None and h.shape[1] == made.hidden else None


def layer_plan(layer) -> Plan | None:
    """The layer's plan, remade when what it was made from changed; None where the layer is not
    one the kernels serve. Rows and autograd are the caller's to check."""
    cached = layer.__dict__.get("_cpu_plan")
    if cached is not None and cached.still_holds():
        return cached
    layer.__dict__.pop("_cpu_plan", None)
    if not cpu_kernels.available():
        return None
    parts = _parts(layer)
    if parts is None:
        return None
    linears, norms = parts
    rows = [_int8_rows(m) if type(m) is Int8Linear else m.output_major() for m in linears]
    scales = [m.fp32_scales_and_bias()[0] if type(m) is Int8Linear else None for m in linears]
    weights = [None if n is None else norm_weight(n) for n in norms]
    if any(r is None for r in rows) or weights[0] is None or weights[2] is None:
        return None
    if (norms[1] is None) != (norms[3] is None) or (norms[1] is not None and (weights[1] is None or weights[3] is None)):
        return None
    eps = {n.eps for n in norms if n is not None}
    if len(eps) != 1:
        return None
    made = _make(layer, linears, rows, scales, weights, eps.pop())
    if made is None:
        return None
    made.watched = _watch(layer)
    layer.__dict__["_cpu_plan"] = made
    return made


def _int8_rows(m: Int8Linear) -> torch.Tensor | None:
    """An int8 layer's weight as the kernels read it (`[out, in]` int8 on the CPU, contiguous)."""
    w = m.weight
    return w if w.dtype == torch.int8 and w.device.type == "cpu" and w.is_contiguous() and w.dim() == 2 else None


def _make(layer, linears, rows, scales, norm_weights, eps) -> Plan | None:
    """The plan, or None where the shapes are not what the kernels assume (the torch layers then
    run, and say what is wrong, instead of the kernels reading past a tensor)."""
    attn = layer.self_attn
    proj_bias = linears[0].bias
    if proj_bias is not None:
        proj_bias = proj_bias.detach().contiguous().float()
    qkv_cols = (attn.num_heads + 2 * attn.num_kv_heads) * attn.head_dim
    hidden, intermediate = rows[0].shape[1], rows[3].shape[1]
    shapes_hold = (
        rows[0].shape[0] >= qkv_cols + (3 if layer.router is not None else 0)
        and tuple(rows[1].shape) == (hidden, attn.num_heads * attn.head_dim)
        and tuple(rows[2].shape) == (2 * intermediate, hidden)
        and tuple(rows[3].shape) == (hidden, intermediate)
        and all(w.numel() == hidden for w in norm_weights if w is not None)
        and (proj_bias is None or proj_bias.numel() == rows[0].shape[0])
        and all(s is None or s.numel() == r.shape[0] for s, r in zip(scales, rows, strict=True))
    )
    if not shapes_hold:
        return None
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    struct = _LayerStruct(
        hidden=hidden, heads=attn.num_heads, kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
        rotary_dim=0, intermediate=intermediate, proj_rows=rows[0].shape[0], eps=eps,
        threads=torch.get_num_threads(),
        input_norm=ptr(norm_weights[0]), proj=ptr(rows[0]), proj_bias=ptr(proj_bias), o_proj=ptr(rows[1]),
        post_attn_norm=ptr(norm_weights[1]), pre_mlp_norm=ptr(norm_weights[2]), gate_up=ptr(rows[2]),
        down=ptr(rows[3]), post_mlp_norm=ptr(norm_weights[3]),
        routed=layer.router is not None, route_threshold=layer.route_threshold,
        proj_scale=ptr(scales[0]), o_proj_scale=ptr(scales[1]), gate_up_scale=ptr(scales[2]),
        down_scale=ptr(scales[3]),
    )
    # kept alive with the plan: what its pointers point into
    keep = [*rows, *[t for t in (*norm_weights, *scales) if t is not None], linears[0].bias, proj_bias]
    return Plan(keep, struct, qkv_cols, layer.router is not None)


def forward(layer, plan_: Plan, h: torch.Tensor, rotations: torch.Tensor, cache) -> torch.Tensor:
    """The layer's output for the rows `h [n, hidden]` (positions and cache as the torch layer
    takes them)."""
    lib = cpu_kernels.library()
    attn = layer.self_attn
    heads, kv_heads, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    n = h.shape[0]
    rotations = _rotations(rotations, n, d)
    _arm(plan_, rotations)
    h = h.contiguous()
    if type(cache) is LayerCache:
        if n == 1:
            kv_row = row(cache, plan_)
            if kv_row is not None:
                return _decode_row(lib, plan_, h, rotations, cache, *kv_row)
        else:
            out = _decode_rows(lib, plan_, h, rotations, cache)
            if out is not None:
                return out
    proj = torch.empty(n, plan_.struct.proj_rows)
    scratch = torch.empty(n, 2 * plan_.hidden + 3 * plan_.intermediate)
    norms = torch.empty(n) if attn.window is not None else None
    lib.wecom_layer_pre(plan_.ref, n, h.data_ptr(), rotations.data_ptr(), proj.data_ptr(),
                        scratch.data_ptr(), None if norms is None else norms.data_ptr())
    qkv = proj[:, : plan_.qkv_cols].view(n, heads + 2 * kv_heads, d)
    q = qkv[:, :heads].transpose(0, 1)
    k = qkv[:, heads : heads + kv_heads].transpose(0, 1)
    v = qkv[:, heads + kv_heads :].transpose(0, 1)
    gate = layer.gate(None, proj[:, plan_.qkv_cols : plan_.qkv_cols + 3]) if plan_.routed else None
    if hasattr(cache, "attend"):  # the serving engine's paged cache
        out = cache.attend(q, k, v, norms, gate)
    else:
        out = sparse_attention(q, cache.extend(k, v, norms), attn.window, attn.interval, gate)
    a = out.transpose(0, 1).reshape(n, heads * d).contiguous()
    result = torch.empty(n, plan_.hidden)
    lib.wecom_layer_post(plan_.ref, n, h.data_ptr(), a.data_ptr(), result.data_ptr(), scratch.data_ptr())
    return result


def _rotations(rotations: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """The rotations of `n` rows as the kernels read them: (cos, sin) pairs, checked first."""
    if rotations.shape != (n, rotations.shape[-1]) or rotations.shape[-1] * 2 > d or rotations.dtype != torch.complex64:
        raise ValueError(f"rotations {tuple(rotations.shape)} {rotations.dtype} for {n} rows of head_dim {d}")
    return torch.view_as_real(rotations.contiguous())


def _arm(plan_: Plan, rotations: torch.Tensor) -> None:
    """What a plan's struct takes from the call: the threads to use, the rotary width."""
    plan_.struct.threads = torch.get_num_threads()
    plan_.struct.rotary_dim = rotations.shape[-2] * 2  # the model's, as its rotations carry it


def row(cache: LayerCache, plan_: Plan) -> tuple[KvRowStruct, int] | None:
    """Where a decode row of the layer of `plan_` goes in `cache` (room made for it), as
    `wecom_layer_decode` reads it, and how many keys its query attends to; None where the cache's
    tensors are not what the kernel writes and reads (the torch layers then run). The call must
    be followed by `cache.row_appended()`."""
    slot, undo, logged, block, local, nodes = cache.row_slots()
    buffers = _buffers(cache, plan_.struct.kv_heads, plan_.struct.head_dim)
    if buffers is None:
        return None
    k, v, slots, undo_k, undo_v, undo_slots, norm_log, block_norms = buffers
    if undo < 0:
        undo_k = undo_v = None
    if logged < 0:
        norm_log = block_norms = None
    else:
        norm_log, block_norms = norm_log + 4 * logged, block_norms + 4 * block
    return KvRowStruct(k, v, slots, slot, undo_k, undo_v, undo_slots, undo, norm_log, block_norms, local, nodes), local + nodes


def _buffers(cache: LayerCache, heads: int, d: int) -> tuple | None:
    """The addresses of the cache's keys, values, undo log and norms, with the slots of the keys
    and of the undo log; None unless the keys and values are fp32 `[heads, slots, d]` on the CPU,
    contiguous. Remembered on the cache for the tensors it holds (they change only when it grows,
    and weakly: a cache that grew must not keep its old tensors): a decode step asks this of every
    layer, and the ~8 tensor calls it replaces were as many cache misses there."""
    k, v = cache.k, cache.v
    seen = cache.__dict__.get("_cpu_buffers")
    if seen is not None and seen[0]() is k and seen[1]() is v and seen[2] == heads and seen[3] == d:
        return seen[4]
    if not (k.dtype == torch.float32 and k.device.type == "cpu" and k.dim() == 3 and k.shape[0] == heads
            and k.shape[2] == d and k.is_contiguous() and v.shape == k.shape and v.dtype == k.dtype
            and v.device == k.device and v.is_contiguous()):
        return None
    buffers = (k.data_ptr(), v.data_ptr(), k.shape[1], None, None, 0, None, None)
    if cache.window is not None:
        undo_k, undo_v = cache.undo_k, cache.undo_v
        buffers = (*buffers[:3], undo_k.data_ptr(), undo_v.data_ptr(), undo_k.shape[1],
                   cache.norm_log.data_ptr(), cache.block_norms.data_ptr())
    cache.__dict__["_cpu_buffers"] = (weakref.ref(k), weakref.ref(v), heads, d, buffers)
    return buffers


def row_scratch(plan_: Plan, keys: int) -> int:
    """Floats of scratch `wecom_layer_decode` takes for a row attending to `keys` keys."""
    s = plan_.struct
    return s.proj_rows + 3 * plan_.hidden + s.heads * (s.head_dim + keys) + 3 * plan_.intermediate


def _decode_row(lib, plan_: Plan, h: torch.Tensor, rotations: torch.Tensor, cache: LayerCache,
                kv_row: KvRowStruct, keys: int) -> torch.Tensor:
    """One row through the whole layer in one call, its cache append and attention included."""
    scratch = torch.empty(row_scratch(plan_, keys))
    out = torch.empty(1, plan_.hidden)
    lib.wecom_layer_decode(plan_.ref, ctypes.addressof(kv_row), h.data_ptr(), rotations.data_ptr(), out.data_ptr(),
                           scratch.data_ptr())
    cache.row_appended()
    return out


def _decode_rows(lib, plan_: Plan, h: torch.Tensor, rotations: torch.Tensor, cache: LayerCache) -> torch.Tensor | None:
    """Rows of one sequence through the whole layer in one call: each weight read once for all
    of them, each row appended and attending in turn (`LayerCache.rows_slots`); None where the
    cache cannot take them so (the two calls around the torch attention then run)."""
    n, s = h.shape[0], plan_.struct
    rows = cache.rows_slots(n)
    buffers = None if rows is None else _buffers(cache, s.kv_heads, s.head_dim)
    if buffers is None:
        return None
    k, v, slots, undo_k, undo_v, undo_slots, norm_log, _ = buffers
    structs = (KvRowStruct * n)(*(
        KvRowStruct(k, v, slots, slot, undo_k if undo >= 0 else None, undo_v if undo >= 0 else None, undo_slots,
                    undo, None if logged < 0 else norm_log + 4 * logged, None, local, nodes)
        for slot, undo, logged, local, nodes in rows))
    keys = max(local + nodes for *_, local, nodes in rows)
    per_row = s.proj_rows + 1 + 3 * plan_.hidden + s.heads * s.head_dim + 3 * plan_.intermediate
    scratch = torch.empty(n * per_row + s.heads * keys)
    out = torch.empty(n, plan_.hidden)
    lib.wecom_layer_decode_rows(plan_.ref, n, ctypes.addressof(structs), h.data_ptr(), rotations.data_ptr(),
                                out.data_ptr(), scratch.data_ptr())
    cache.rows_appended(n)
    return out
