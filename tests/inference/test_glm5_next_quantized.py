"""glm5_next (GLM-5.3-Flash) from an FP8 checkpoint in the official releases' block format: the
model of its dequantized weights, projections one tile wide included (the KDA's and the experts'
narrow ones). tests/inference/test_glm5_next.py makes the checkpoint."""

import json

import torch
from safetensors.torch import load_file, save_file

from inference.config import ModelConfig
from inference.loader import load_model
from tests.inference.test_glm4_moe import dequantized, fp8_blocks
from tests.inference.test_glm5_next import VOCAB, checkpoint, logits_of  # noqa: F401 - a fixture


def test_an_fp8_checkpoint_is_the_model_of_its_dequantized_weights(checkpoint, tmp_path):  # noqa: F811
    _, path = checkpoint
    state = load_file(path / "model.safetensors")
    fp8_state, quantized = {}, 0
    for name, tensor in state.items():
        if (tensor.dim() == 2 and name.startswith("model.language_model.layers.") and name.endswith("proj.weight")
                and min(tensor.shape) >= 16):
            fp8_state[name], fp8_state[name + "_scale_inv"] = fp8_blocks(tensor, 16)
            quantized += 1
        else:
            fp8_state[name] = tensor
    assert quantized > 20  # attention, KDA and expert projections
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16],
                                     "activation_scheme": "dynamic"}
    (tmp_path / "fp8").mkdir()
    save_file(fp8_state, str(tmp_path / "fp8" / "model.safetensors"))
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(config))
    fp8 = load_model(tmp_path / "fp8", ModelConfig.from_pretrained(tmp_path / "fp8"), "cpu")
    (tmp_path / "plain").mkdir()
    save_file(dequantized(fp8_state, 16), str(tmp_path / "plain" / "model.safetensors"))
    (tmp_path / "plain" / "config.json").write_text((path / "config.json").read_text())
    plain = load_model(tmp_path / "plain", ModelConfig.from_pretrained(tmp_path / "plain"), "cpu")
    ids = torch.randint(3, VOCAB, (24,))
    torch.testing.assert_close(logits_of(fp8, ids), logits_of(plain, ids), atol=1e-5, rtol=1e-5)
