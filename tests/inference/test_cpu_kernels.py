"""The compiled batch-1 fp32 matrix-vector kernel: its results, its build cache, its fallbacks,
and `Fp32Matmul` handing it one row."""

import ctypes
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

from inference.layers import linear
from inference.layers.kernels import cpu_kernels
from inference.layers.linear import Linear, input_major

needs_kernel = pytest.mark.usefixtures("cpu_kernels_built")


@needs_kernel
@pytest.mark.parametrize("n, k", [(1, 1), (3, 5), (4, 16), (7, 17), (64, 768), (1029, 771), (96, 2304)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_matmul_matches_torch_for_any_shape(n, k, bias, rows):
    """Output rows that are and are not multiples of the 4-row group, K with and without a
    16-wide tail, one input row and a few."""
    gen = torch.Generator().manual_seed(n * 1000 + k)
    w, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    torch.testing.assert_close(cpu_kernels.matmul(x, w, b), F.linear(x, w, b), atol=1e-4, rtol=1e-5)


@needs_kernel
def test_the_portable_loop_matches_torch_too(tmp_path):
    """The path a CPU without AVX-512 compiles, forced on this one."""
    portable = cpu_kernels.declare(ctypes.CDLL(str(cpu_kernels.build(cpu_kernels._compiler(), tmp_path, ("-DWECOM_GEMV_PORTABLE",)))))
    gen = torch.Generator().manual_seed(3)
    for n, k in ((1, 1), (5, 7), (1029, 771), (64, 2304)):
        w, x, b = torch.randn(n, k, generator=gen), torch.randn(3, k, generator=gen), torch.randn(n, generator=gen)
        torch.testing.assert_close(cpu_kernels.matmul(x, w, b, lib=portable), F.linear(x, w, b), atol=1e-4, rtol=1e-5)


@needs_kernel
def test_a_row_gets_the_same_bits_whatever_the_threads_and_rows_beside_it():
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(1031, 300, generator=gen), torch.randn(1, 300, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_kernels.matmul(x, w)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(cpu_kernels.matmul(x, w), one)
    assert torch.equal(cpu_kernels.matmul(x, w[5:6].contiguous()), one[:, 5:6])  # a tail row alone
    assert torch.equal(cpu_kernels.matmul(x, w[1028:].contiguous()), one[:, 1028:])
    others = torch.randn(4, 300, generator=gen)
    beside = cpu_kernels.matmul(torch.cat((others[:2], x, others[2:])), w)  # a verify's rows
    assert torch.equal(beside[2:3], one)


@needs_kernel
def test_a_strided_input_row_is_read_as_its_values():
    w = torch.randn(8, 32)
    wide = torch.randn(1, 64)
    x = wide[:, ::2]  # not contiguous
    torch.testing.assert_close(cpu_kernels.matmul(x, w), x @ w.t(), atol=1e-5, rtol=1e-5)


@needs_kernel
def test_rows_of_the_wrong_width_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="rows of 8 features"):
        cpu_kernels.matmul(torch.randn(2, 9), torch.randn(4, 8))


@needs_kernel
def test_build_is_cached_and_keyed_by_the_source(tmp_path, monkeypatch):
    compiler = cpu_kernels._compiler()
    first = cpu_kernels.build(compiler, tmp_path)
    stamp = first.stat().st_mtime_ns
    assert cpu_kernels.build(compiler, tmp_path) == first and first.stat().st_mtime_ns == stamp  # not rebuilt
    changed = tmp_path / "dsa_kernels.c"
    changed.write_text(cpu_kernels.SOURCES[1].read_text() + "\n/* changed */\n")
    monkeypatch.setattr(cpu_kernels, "SOURCES", (cpu_kernels.SOURCES[0], changed))
    assert cpu_kernels.build(compiler, tmp_path) != first  # another source: another library
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no scratch left behind


def test_a_failed_build_says_why_and_leaves_the_library_kernels(tmp_path, monkeypatch, caplog):
    broken = tmp_path / "cpu_kernels.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(cpu_kernels, "SOURCES", (broken, cpu_kernels.SOURCES[1]))
    monkeypatch.setenv("INFERENCE_KERNEL_DIR", str(tmp_path / "cache"))
    if cpu_kernels._compiler() is None:
        pytest.skip("no C compiler here")
    cpu_kernels.library.cache_clear()
    try:
        assert cpu_kernels.library() is None
        assert "could not be built" in caplog.text
        assert "the build failed" in cpu_kernels.describe()
    finally:
        cpu_kernels.library.cache_clear()
    assert not list((tmp_path / "cache").glob("*.so"))


def test_off_or_without_a_compiler_there_is_no_kernel_and_the_cli_says_why(monkeypatch, tmp_path, capsys):
    from inference.__main__ import main

    cpu_kernels.library.cache_clear()
    try:
        monkeypatch.setenv("INFERENCE_CPU_KERNELS", "0")
        assert cpu_kernels.library() is None
        assert main(["kernels"]) == 1 and "turned off" in capsys.readouterr().out
        cpu_kernels.library.cache_clear()
        monkeypatch.delenv("INFERENCE_CPU_KERNELS")
        monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
        monkeypatch.setattr(shutil, "which", lambda name: None)
        assert cpu_kernels.library() is None
        assert main(["kernels"]) == 1 and "no C compiler" in capsys.readouterr().out
    finally:
        cpu_kernels.library.cache_clear()


@needs_kernel
def test_the_cli_builds_and_names_the_kernels(capsys):
    from inference.__main__ import main

    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CPU kernels: ") and ".so" in out


def test_a_compiler_that_cannot_run_is_a_build_error(tmp_path):
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(subprocess.CalledProcessError):
        cpu_kernels.build(str(fake), tmp_path / "cache")


def _input_major_linear(rows_out: int, rows_in: int, bias: bool) -> Linear:
    layer = Linear(rows_in, rows_out, bias=bias)
    layer.weight = torch.nn.Parameter(input_major(layer.weight.detach()))
    return layer


@needs_kernel
def test_a_few_rows_go_to_the_kernel_and_its_copy_follows_weight_changes(monkeypatch):
    monkeypatch.setattr(linear, "FP32_MATMUL", "auto")
    torch.manual_seed(0)
    layer = _input_major_linear(48, 40, bias=True)
    x = torch.randn(1, 40)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        five = torch.randn(5, 40)
        torch.testing.assert_close(layer(five), F.linear(five, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        assert [c.__name__ for c in layer._fp32._calls[:2]] == ["few_rows", "few_rows"]
        assert layer._fp32._rows.is_contiguous() and torch.equal(layer._fp32._rows, layer.weight)
    with torch.no_grad():
        layer.weight.mul_(2)  # in place: the output-major copy is remade
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer(x[None]), F.linear(x[None], layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


@needs_kernel
def test_the_kernel_copy_counts_against_the_byte_cap(monkeypatch):
    monkeypatch.setattr(linear, "FP32_MATMUL", "auto")
    layers = [_input_major_linear(16, 32, bias=False) for _ in range(2)]
    one = 32 * 16 * 4
    monkeypatch.setattr(linear, "FP32_PACKED_MAX_BYTES", linear.packed_bytes() + one)
    x = torch.randn(1, 32)
    with torch.inference_mode():
        outs = [layer(x) for layer in layers]
    assert layers[0]._fp32._calls[0].__name__ == "few_rows"
    assert layers[1]._fp32._calls[0].__name__ != "few_rows" and layers[1]._fp32._rows is None
    assert linear.packed_bytes() >= one
    for layer, out in zip(layers, outs, strict=True):
        torch.testing.assert_close(out, F.linear(x, layer.weight), atol=1e-5, rtol=1e-5)


@needs_kernel
def test_a_pinned_library_kernel_keeps_the_few_rows_too(monkeypatch):
    monkeypatch.setattr(linear, "FP32_MATMUL", "mkl")
    layer = _input_major_linear(16, 32, bias=False)
    with torch.inference_mode():
        layer(torch.randn(1, 32))
    assert layer._fp32._calls[0].__name__ == "mkl" and layer._fp32._rows is None


def test_the_cache_directory_comes_from_the_environment_with_the_home_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERENCE_KERNEL_DIR", "~/kernels-here")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cpu_kernels.cache_dir() == tmp_path / "kernels-here"
    monkeypatch.delenv("INFERENCE_KERNEL_DIR")
    assert cpu_kernels.cache_dir() == tmp_path / ".cache" / "wecom-bot" / "kernels"
