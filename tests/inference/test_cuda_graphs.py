"""inference/engine/cuda_graphs.py off the GPU: which steps and models graphs take, and the guard
that refuses host reads in a captured step (the replays themselves run under Triton's
interpreter in test_paged_decode_triton.py)."""

import pytest
import torch

from inference.config import ModelConfig
from inference.engine import EngineArgs, LLMEngine, cuda_graphs
from inference.layers.caches.layouts import cache_layout
from tests.inference.helpers import glm5_config

GLM4 = dict(model_type="glm4", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8)
MLA = dict(GLM4, model_type="glm4_moe_lite", q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
           qk_rope_head_dim=4, v_head_dim=8, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2)
DSA = dict(MLA, model_type="glm_moe_dsa", index_topk=8, index_n_heads=2, index_head_dim=8)
MOE = dict(GLM4, model_type="glm4_moe", moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2)


def test_buckets_are_small_sizes_then_multiples_of_eight_up_to_the_largest_batch():
    assert cuda_graphs.buckets(1) == [1]
    assert cuda_graphs.buckets(4) == [1, 2, 4]
    assert cuda_graphs.buckets(20) == [1, 2, 4, 8, 16, 20]
    assert cuda_graphs.buckets(64) == [1, 2, 4, *range(8, 65, 8)]


def test_only_models_whose_decode_has_a_static_shape_are_captured(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "MODE", "emulate")
    monkeypatch.setattr(cuda_graphs.paged_decode_triton, "wanted", lambda device: True)
    cpu = torch.device("cpu")
    layout = {name: cache_layout(ModelConfig.from_dict(shape)) for name, shape in
              (("glm4", GLM4), ("glm4_moe", MOE), ("glm4_moe_lite", MLA), ("glm_moe_dsa", DSA))}
    layout["glm5_sparse"] = cache_layout(ModelConfig.from_dict(glm5_config(num_mtp_heads=0)))
    assert {name: cuda_graphs.wanted(cpu, lay) for name, lay in layout.items()} == {
        "glm4": True, "glm4_moe": True, "glm4_moe_lite": True, "glm_moe_dsa": False, "glm5_sparse": False}
    monkeypatch.setattr(cuda_graphs, "MODE", "auto")  # auto: CUDA devices only
    assert not cuda_graphs.wanted(cpu, layout["glm4"])
    monkeypatch.setattr(cuda_graphs, "MODE", "0")
    assert not cuda_graphs.wanted(torch.device("cuda"), layout["glm4"])


def test_host_reads_are_refused_inside_a_captured_step_and_allowed_after():
    t = torch.tensor([3, 4])
    with cuda_graphs.no_host_reads():
        for read in (t[0].item, t.tolist, lambda: bool(t[0]), lambda: int(t[0]), lambda: float(t[0]),
                     lambda: [0, 1, 2][t[0]]):
            with pytest.raises(cuda_graphs.HostReadInGraph):
                read()
        assert (t * 2).sum().shape == ()  # device work goes on
    assert t.tolist() == [3, 4] and t[1].item() == 4 and int(t[0]) == 3


def test_a_cpu_engine_captures_nothing_and_keeps_every_block(monkeypatch):
    from inference.models.glm4 import Glm4ForCausalLM

    torch.manual_seed(0)
    model = Glm4ForCausalLM(ModelConfig.from_dict(GLM4)).eval()
    args = EngineArgs(block_size=16, kv_cache_bytes=cache_layout(model.config).bytes_per_block(16, torch.float32) * 5)
    engine = LLMEngine(model, args=args, eos_token_ids=[])
    assert engine.runner.graphs is None and engine.runner.num_blocks == engine.runner.cache.num_blocks == 5
    monkeypatch.setattr(cuda_graphs, "MODE", "emulate")
    monkeypatch.setattr(cuda_graphs.paged_decode_triton, "wanted", lambda device: True)
    eager = LLMEngine(model, args=EngineArgs(**{**args.__dict__, "enforce_eager": True}), eos_token_ids=[])
    assert eager.runner.graphs is None and eager.runner.num_blocks == 5  # wanted, but told not to

