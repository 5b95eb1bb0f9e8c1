import pytest
import torch

from inference.layers.kernels import cpu_kernels


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def cpu_kernels_built():
    """The tests of the compiled CPU kernels (`pytest.mark.usefixtures("cpu_kernels_built")`).

    They skip only where the kernels are absent on purpose: `INFERENCE_CPU_KERNELS=0`, or no C
    compiler on PATH (`CC`, `cc`, `gcc`). With a compiler, a build that fails (a syntax error in
    `cpu_kernels.c`, a missing header, a bad flag) fails every one of them with the compiler's
    error: production falls back to the library kernels then, the tests must not."""
    if not cpu_kernels.enabled():
        pytest.skip("CPU kernels turned off (INFERENCE_CPU_KERNELS=0)")
    if cpu_kernels._compiler() is None:
        pytest.skip("no C compiler on PATH (CC, cc or gcc) to build cpu_kernels")
    if cpu_kernels.library() is None:
        pytest.fail(f"the CPU kernels did not build with {cpu_kernels._compiler()}: "
                    f"{cpu_kernels.describe()}", pytrace=False)


def pytest_report_header(config):
    """The shape sweep's seed, where this conftest is loaded before collection (a run of
    tests/inference or below); the terminal summary says it in every run."""
    from tests.inference import shape_sweep

    return shape_sweep.rerun_hint()


def pytest_terminal_summary(terminalreporter):
    import sys

    sweep = sys.modules.get("tests.inference.shape_sweep")
    if sweep is not None and "tests.inference.test_shape_sweep" in sys.modules:  # the sweep was collected
        terminalreporter.write_line(sweep.TALLY.summary())
