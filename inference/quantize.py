"""Write a W8A16 checkpoint: every linear weight as int8 rows plus one fp32 scale per row.

`X.weight` becomes int8 and `X.weight_scale` ([out], fp32) sits beside it; config.json gets
`"quantization": "w8a16"`, so `LLM.from_pretrained` builds `Int8Linear` layers from it. The
embedding, the MoE router, MLA's `kv_b_proj`, the 2-D tensors a model class names in
`int8_dense_suffixes` / `int8_dense_prefixes` (and anything not 2-D) stay as they were: the
loader would dequantize them and keep the rounded values, where quantizing at load time leaves
every tensor that is not a `Linear` weight exact. Other files (tokenizer, generation config) are
copied.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from inference.config import ModelConfig
from inference.layers.linear import quantize_weight
from inference.loader import SCALE_SUFFIX, checkpoint_files
from inference.models import MODELS

# the embedding; GLM's MoE router (kept fp32); MLA's kv_b_proj, read per head (inference/layers/mla.py)
KEEP_DENSE = ("embed_tokens.weight", "mlp.gate.weight", "self_attn.kv_b_proj.weight")


def quantize_checkpoint(model_dir: str | Path, out_dir: str | Path) -> Path:
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_class = MODELS[ModelConfig.from_pretrained(model_dir).model_type]
    suffixes = KEEP_DENSE + getattr(model_class, "int8_dense_suffixes", ())
    prefixes = getattr(model_class, "int8_dense_prefixes", ())
    state = {}
    for name, path in sorted(checkpoint_files(model_dir).items()):
        with safe_open(path, framework="pt") as f:
            tensor = f.get_tensor(name)
        if tensor.dim() == 2 and not name.endswith(suffixes) and not name.startswith(prefixes):
            state[name], state[name + SCALE_SUFFIX] = quantize_weight(tensor)
        else:
            state[name] = tensor
    save_file({k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"))
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization"] = "w8a16"
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for other in model_dir.iterdir():
        if (
            other.is_file()
            and other.name not in ("config.json",)
            and not other.name.startswith("model.safetensors")
        ):
            shutil.copy2(other, out_dir / other.name)
    return out_dir
