"""Checkpoint loading: sharded files, and errors that name the tensor."""

import json

import pytest
import torch
from safetensors.torch import save_file

from inference.config import ModelConfig, serving_dtype
from inference.loader import CheckpointError, checkpoint_state_dict, load_model
from tests.inference.helpers import glm5_config, random_state, write_checkpoint


@pytest.fixture
def raw():
    return glm5_config()


@pytest.fixture
def state(raw):
    return random_state(ModelConfig.from_dict(raw))


def load(path):
    return load_model(path, ModelConfig.from_pretrained(path), "cpu")


def test_loads_every_tensor(tmp_path, raw, state):
    model = load(write_checkpoint(tmp_path, raw, state))
    loaded = checkpoint_state_dict(model)
    assert loaded.keys() == state.keys()
    for name, tensor in loaded.items():
        torch.testing.assert_close(tensor, state[name], rtol=0, atol=0)
    assert "model.layers.1.router.weight" in state and "model.mtp.0.block.mlp.down_proj.weight" in state


def test_sharded_checkpoint(tmp_path, raw, state):
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({n: state[n].contiguous() for n in part}, str(tmp_path / file))
    weight_map = {n: file for file, part in shards.items() for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    model = load(tmp_path)
    torch.testing.assert_close(model.lm_head.weight, state["lm_head.weight"], rtol=0, atol=0)


def test_missing_tensor_is_named(tmp_path, raw, state):
    del state["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(CheckpointError, match=r"missing tensor model\.layers\.1\.self_attn\.k_proj\.weight"):
        load(write_checkpoint(tmp_path, raw, state))


def test_extra_tensor_is_named(tmp_path, raw, state):
    state["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    with pytest.raises(CheckpointError, match=r"unexpected tensor model\.layers\.0\.mlp\.extra\.weight"):
        load(write_checkpoint(tmp_path, raw, state))


def test_misshaped_tensor_is_named(tmp_path, raw, state):
    state["model.norm.weight"] = torch.ones(31)
    with pytest.raises(CheckpointError, match=r"mis-shaped tensor model\.norm\.weight: checkpoint \(31,\)"):
        load(write_checkpoint(tmp_path, raw, state))


def test_tied_embeddings_need_no_lm_head(tmp_path):
    raw = glm5_config(tie_word_embeddings=True)
    state = random_state(ModelConfig.from_dict(raw))
    state.pop("lm_head.weight", None)
    model = load(write_checkpoint(tmp_path, raw, state))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_config_defaults_and_dtype(tmp_path):
    raw = glm5_config(dtype="bfloat16")
    del raw["sliding_window"], raw["global_interval"]
    config = ModelConfig.from_dict(raw)
    assert (config.sliding_window, config.global_interval, config.routed) == (512, 64, True)
    assert config.dtype == torch.bfloat16
    assert ModelConfig.from_dict(raw, dtype="fp32").dtype == torch.float32
    glm4 = ModelConfig.from_dict(glm5_config(model_type="glm4", sliding_window=None, global_interval=None))
    assert not glm4.sparse and not glm4.routed and glm4.attention_bias and glm4.num_mtp_heads == 0


TINY_GLM4 = dict(model_type="glm4", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def test_an_fp32_checkpoint_serves_in_bf16_on_cuda_unless_the_caller_pins_fp32():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    checkpoint = ModelConfig.from_dict(TINY_GLM4)  # no dtype in the config: fp32
    assert not checkpoint.dtype_given and checkpoint.dtype == torch.float32
    assert serving_dtype(checkpoint, cuda) == torch.bfloat16 and serving_dtype(checkpoint, cpu) == torch.float32
    assert serving_dtype(ModelConfig.from_dict(TINY_GLM4, dtype="fp32"), cuda) == torch.float32
    assert serving_dtype(ModelConfig.from_dict({**TINY_GLM4, "torch_dtype": "float16"}), cuda) == torch.float16
