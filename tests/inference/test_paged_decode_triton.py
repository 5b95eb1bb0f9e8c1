"""The CUDA paged decode attention programs (inference/layers/kernels/paged_decode_triton.py), run here by
Triton's interpreter: the same programs the GPU compiles, against a float64 reference, for
slot lists that end inside, exactly at and past a block, and heads that do not fill a block."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inference import shape_sweep

pytest.importorskip("triton")  # a dev dependency; torch's CUDA wheels bring it too

ROOT = Path(__file__).resolve().parents[2]
# the interpreter runs every program in Python: 300 s on a 2-core AVX2 EPYC alone (7 Dec 2026),
# more under the suite's load; the limits guard against a hang, not a slow machine
pytestmark = pytest.mark.timeout(1200)
TOLERANCE = {"float32": 2e-6, "float16": 2e-3}


@pytest.fixture(scope="module")
def interpreted() -> dict:
    script = Path(__file__).with_name("paged_decode_interpreted.py")
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=1000,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT),
                               "SWEEP_SEED": str(shape_sweep.SEED)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_gqa_decode_equals_softmax_over_each_sequences_slots(interpreted):
    """...and a row read through its block table (dense decode) gives what its slot list gives."""
    assert len(interpreted["gqa"]) == 4 * 2  # three fixed shapes and the sweep's random one
    for case in interpreted["gqa"]:
        assert case["out_dtype"] == case["dtype"] and case["error"] < TOLERANCE[case["dtype"]], case
        assert case["paged_difference"] == 0.0, case


def test_gqa_prefill_equals_causal_softmax_over_each_sequences_slots(interpreted):
    """Prompts of 1, 16 and 37 rows, a chunk after 50 cached positions and a decode row in one
    launch; GQA groups of 4, 1 and 3 heads; dense, and a sparse window with key nodes in union
    and routed mode (some rows' paths zeroed by the router). Read through block tables and node
    page tables (as the engine passes them), the step gives what its slot lists give."""
    assert len(interpreted["gqa_prefill"]) == 3 * 3 * 2
    assert {case["mode"] for case in interpreted["gqa_prefill"]} == {"dense", "union", "routed"}
    for case in interpreted["gqa_prefill"]:
        assert case["out_dtype"] == case["dtype"] and case["error"] < TOLERANCE[case["dtype"]], case
        assert case["paged_difference"] == 0.0, case


def test_grouped_experts_equal_the_loop_over_experts(interpreted):
    """A decode row, 5 rows and 70 (more rows for an expert than a block holds), two experts
    chosen by no token; two launches each; the experts' own weights, now views of the stacks,
    give the loop the same answer as before."""
    assert len(interpreted["moe"]) == 3 * 2
    for case in interpreted["moe"]:
        assert case["calls"] == 2 and case["out_dtype"] == case["dtype"], case
        assert case["error"] < {"float32": 2e-6, "float16": 5e-3}[case["dtype"]], case
        assert case["views_error"] == 0.0, case


def test_latent_decode_equals_mla_in_latent_space(interpreted):
    assert len(interpreted["latent"]) == 4 * 2  # three fixed shapes and the sweep's random one
    for case in interpreted["latent"]:
        heads, rank, _ = case["shape"]
        assert case["out_shape"] == [4, heads, rank] and case["error"] < TOLERANCE[case["dtype"]], case
        assert case["paged_difference"] == 0.0, case  # read through block tables: the same rows


@pytest.mark.parametrize("model_type", ["glm4_graphs", "glm4_graphs_preempted", "glm4_moe_lite_graphs"])
def test_decode_steps_replayed_from_cuda_graphs_give_the_eager_tokens(interpreted, model_type):
    """Decode steps replayed as the engine captures them for CUDA graphs (emulated here: the
    captured step run again on its static buffers, host reads refused as a capture refuses them):
    GLM-4 (GQA) and GLM-4.7-Flash (MLA + MoE); requests of different lengths, so the batch of 3
    pads to the bucket of 4 and shrinks through 2 and 1; `_preempted`: chunked prefills beside the
    replays, a prefix-cache hit and sequences preempted and resumed (block tables that change).
    Each replay's hidden states equal the same step made the ordinary way, and the tokens the
    torch path's."""
    run = interpreted["engines"][model_type]
    assert run["replays"] >= 10, run["replays"]
    if model_type.endswith("_preempted"):
        assert run["preemptions"] > 0, run["preemptions"]
    else:
        assert run["buckets"] == [1, 2, 4], run["buckets"]
    assert run["worst_difference"] < 1e-4, run["worst_difference"]
    assert run["tokens"] == run["reference"]


@pytest.mark.parametrize("model_type", ["glm4", "glm4_prefill", "glm4_preempted", "glm5_sparse_routed_preempted",
                                        "glm5_sparse_union_prefill",
                                        "glm5_sparse_routed_prefill", "glm4_moe_lite_prefill", "glm_moe_dsa_prefill",
                                        "glm5_sparse_union", "glm5_sparse_routed", "glm4_moe_lite",
                                        "glm_moe_dsa"])
def test_the_engine_decodes_through_the_kernels_as_through_torch(interpreted, model_type):
    """GQA (GLM-4; the sparse window in union and routed mode, past the window so key nodes count;
    `_prefill`: steps of 24 tokens, so prompts are prefilled in chunks beside decode rows and one
    starts from another's cached prefix, every step through `gqa_prefill`; `_preempted`: so few
    blocks that a sequence is preempted and recomputed),
    MLA (GLM-4.7-Flash; `_prefill`: chunks short enough for the absorbed form, each row reading
    its sequence's slots up to its own position) and DSA (GLM-5, its chosen rows read through
    their slots, in decode and, `_prefill`, in chunked prefill too): the serving engine's steps
    take one launch a layer and
    give the torch path's tokens (the MoE layers' grouped experts included)."""
    run = interpreted["engines"][model_type]
    assert run["kernel_calls"] > 0
    assert (run["preemptions"] > 0) == model_type.endswith("_preempted"), run["preemptions"]
    # GLM-4.7-Flash's and GLM-5's MoE layers run their experts grouped (two launches a layer)
    assert (run["moe_calls"] > 0) == model_type.startswith(("glm4_moe_lite", "glm_moe_dsa")), run["moe_calls"]
    assert run["worst_difference"] < 1e-4, run["worst_difference"]  # each step's attention, not just tokens
    assert run["tokens"] == run["reference"]
