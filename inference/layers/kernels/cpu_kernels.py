"""fp32 CPU kernels for decoding a few rows, compiled on this machine on first use.

A decode step reads every weight once for one row of activations (or a few: a verify, a small
batch): it is bound by memory reads, and the library kernels lose time there. Measured on a
2-core AVX-512 EPYC, the decode steps of a 132M GLM-4 (all linears in place, interleaved runs,
4 Dec 2026): the step took 71 % of the read-bandwidth bound with this kernel against 57 % with
oneDNN's packed one-row kernel (the best library choice there) and 61 % with the same loop on
the input-major weight. In a tight loop over the weights alone all of them read near the
bandwidth; between the other ops of a step the library kernels fall behind. The same source
holds the fused decoder-layer calls of `inference/models/cpu_decode.py` (a layer around its
attention for a few rows; a whole layer, cache append and attention included, for one row) and
the whole-model decode step of `inference/models/cpu_step.py`.

`cpu_kernels.c` is compiled with the system C compiler (`CC`, else `cc`) and `-march=native` into
a per-user cache (`INFERENCE_KERNEL_DIR`, default `~/.cache/wecom-bot/kernels`), keyed by the
source, the flags, the compiler and the CPU, and loaded with ctypes. It links the OpenMP runtime
by soname, so it shares torch's (loaded first) and its threads. Without a compiler, or when the
build fails, `library()` is None and the callers keep the library kernels and torch layers
(logged once); `INFERENCE_CPU_KERNELS=0` turns them off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = (Path(__file__).with_name("cpu_kernels.c"), Path(__file__).with_name("dsa_kernels.c"))
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-shared", "-fPIC")


def enabled() -> bool:
    return os.environ.get("INFERENCE_CPU_KERNELS", "1") != "0"


def cache_dir() -> Path:
    return Path(os.environ.get("INFERENCE_KERNEL_DIR") or "~/.cache/wecom-bot/kernels").expanduser()


def _cpu_id() -> str:
    """What -march=native depends on: the CPU model and its flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(lines))  # one copy per distinct line, not per core


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")


def build(compiler: str, directory: Path, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile the kernel (or find it already compiled) and return the shared library's path.
    Raises `OSError` or `subprocess.CalledProcessError` when it cannot."""
    flags = (*FLAGS, *extra_flags)
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    texts = [source.read_text() for source in SOURCES]
    key = hashlib.sha256("\0".join([*texts, *flags, version, _cpu_id()]).encode()).hexdigest()[:16]
    target = directory / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        built = Path(scratch) / target.name
        subprocess.run([compiler, *flags, *map(str, SOURCES), "-o", str(built)], capture_output=True, text=True, check=True)
        os.replace(built, target)  # atomic: processes building at once each land a whole file
    return target


_WHY_NOT: list[str] = []  # why `library()` is None, once it has been asked


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where they are off or cannot be built here (said once)."""
    _WHY_NOT.clear()
    if not enabled():
        _WHY_NOT.append("turned off (INFERENCE_CPU_KERNELS=0)")
        return None
    compiler = _compiler()
    if compiler is None:
        _WHY_NOT.append("no C compiler found (CC, cc or gcc)")
        log.info("no C compiler found: fp32 CPU decoding uses the library kernels")
        return None
    try:
        lib = ctypes.CDLL(str(build(compiler, cache_dir())))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = str(getattr(exc, "stderr", "") or exc)[:500]
        _WHY_NOT.append(f"the build failed: {detail}")
        log.warning("the CPU kernels could not be built, library kernels are used: %s", detail)
        return None
    return declare(lib)


def describe() -> str:
    """One line on the kernels of this machine: the library loaded and its code path, or why
    there is none (`python -m inference kernels`)."""
    lib = library()
    if lib is None:
        return f"CPU kernels unavailable: {_WHY_NOT[0] if _WHY_NOT else 'unknown'}"
    path = "AVX-512" if "avx512f" in _cpu_id() else "portable"
    return f"CPU kernels: {lib._name} ({path} path)"


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Give the kernels' entry points their C signatures (pointers as addresses)."""
    pointer = ctypes.c_void_p
    for name, argtypes in (
        ("wecom_gemm_f32", [pointer, pointer, ctypes.c_long, pointer, pointer, ctypes.c_long,
                            ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_int]),
        ("wecom_gemm_i8", [pointer, pointer, pointer, ctypes.c_long, pointer, pointer, ctypes.c_long,
                           ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_int]),
        ("wecom_layer_pre", [pointer, ctypes.c_long] + [pointer] * 5),
        ("wecom_layer_post", [pointer, ctypes.c_long] + [pointer] * 4),
        ("wecom_layer_decode", [pointer] * 6),
        ("wecom_layer_decode_rows", [pointer, ctypes.c_long] + [pointer] * 5),
        ("wecom_decode_step", [pointer] * 6),
        ("wecom_silu_mul", [pointer] * 3 + [ctypes.c_long]),
        ("wecom_moe_experts", [pointer] * 6),
        ("wecom_dsa_select", [pointer] * 3 + [ctypes.c_long, pointer] + [ctypes.c_long] * 4
         + [ctypes.c_float, pointer, pointer, ctypes.c_int]),
        ("wecom_dsa_top_rows", [pointer, ctypes.c_long, pointer, ctypes.c_long, ctypes.c_long, pointer, pointer,
                                ctypes.c_int]),
        ("wecom_dsa_select_rows", [pointer] * 5 + [ctypes.c_long] * 4 + [ctypes.c_float, pointer, pointer,
                                                                        ctypes.c_int]),
        ("wecom_dsa_attend", [pointer, ctypes.c_long, ctypes.c_long] + [pointer] * 4 + [ctypes.c_long] * 5
         + [ctypes.c_float, pointer, ctypes.c_int]),
    ):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int if name == "wecom_decode_step" else None
    return lib


def available() -> bool:
    return library() is not None


def matmul(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, lib: ctypes.CDLL | None = None
) -> torch.Tensor:
    """`x [R, K] @ weight.T (+ bias)` for a contiguous fp32 CPU `weight [N, K]`; returns `[R, N]`.
    Meant for a few rows (decode, verify, small batches): the weight is read once for all of
    them. The caller checks `available()` and the dtypes; `x` is made contiguous if it is not.
    `lib`: another build of the kernels (tests)."""
    n, k = weight.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"matmul takes rows of {k} features, got {tuple(x.shape)}")
    if bias is not None and bias.numel() != n:
        raise ValueError(f"bias of {bias.numel()} for {n} outputs")
    x = x.contiguous()
    rows = x.shape[0]
    out = torch.empty(rows, n, dtype=torch.float32)
    (lib or library()).wecom_gemm_f32(
        weight.data_ptr(), x.data_ptr(), k, None if bias is None else bias.data_ptr(), out.data_ptr(), n,
        rows, n, k, torch.get_num_threads())
    return out


def matmul_int8(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """`(x [R, K] @ weight.T) * scales (+ bias)` for a contiguous int8 CPU `weight [N, K]`, fp32
    `x`, contiguous fp32 `scales [N]` and `bias [N]`; returns fp32 `[R, N]`. For a few rows, as
    `matmul`; the caller checks `available()` and the dtypes."""
    n, k = weight.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"matmul_int8 takes rows of {k} features, got {tuple(x.shape)}")
    if scales.numel() != n or (bias is not None and bias.numel() != n):
        raise ValueError(f"scales of {scales.numel()} / bias of {None if bias is None else bias.numel()} for {n} outputs")
    x = x.contiguous()
    rows = x.shape[0]
    out = torch.empty(rows, n, dtype=torch.float32)
    (lib or library()).wecom_gemm_i8(
        weight.data_ptr(), scales.data_ptr(), x.data_ptr(), k, None if bias is None else bias.data_ptr(),
        out.data_ptr(), n, rows, n, k, torch.get_num_threads())
    return out
