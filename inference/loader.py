"""Load a model from a safetensors checkpoint directory (single file or sharded by index)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from inference.config import ModelConfig, default_device
from inference.models import MODELS
from inference.models.glm5_sparse import Glm5SparseForCausalLM

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """The checkpoint does not match the model: names the offending tensors."""


def checkpoint_files(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    index = model_dir / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / SINGLE_FILE
    if not single.exists():
        raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}")
    with safe_open(single, framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def load_model(
    model_dir: str | Path, config: ModelConfig, device: torch.device | str | None = None
) -> Glm5SparseForCausalLM:
    """Build the model of `config.model_type` and fill it from the checkpoint.

    The model is built on the meta device (no wasted random init) and each tensor is read once,
    cast to `config.dtype` and placed on `device` (CUDA when present, else CPU). Every missing,
    unexpected or mis-shaped tensor is reported by name in one `CheckpointError`. With tied
    embeddings `lm_head.weight` is optional and, when present, ignored.
    """
    model_dir, device = Path(model_dir), torch.device(device or default_device())
    with torch.device("meta"):
        model = MODELS[config.model_type](config)
    expected = {name: p.shape for name, p in model.named_parameters()}  # tied weights appear once
    files = checkpoint_files(model_dir)
    optional = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = sorted(set(expected) - set(files))
    unexpected = sorted(set(files) - set(expected) - optional)
    state, wrong_shape = {}, []
    by_file: dict[Path, list[str]] = {}
    for name in expected.keys() & files.keys():
        by_file.setdefault(files[name], []).append(name)
    for path, names in by_file.items():
        with safe_open(path, framework="pt", device=str(device)) as f:
            for name in names:
                tensor = f.get_tensor(name)
                if tensor.shape != expected[name]:
                    wrong_shape.append(f"{name}: checkpoint {tuple(tensor.shape)}, model {tuple(expected[name])}")
                    continue
                state[name] = tensor.to(config.dtype)
    problems = (
        [f"missing tensor {n}" for n in missing]
        + [f"unexpected tensor {n}" for n in unexpected]
        + [f"mis-shaped tensor {s}" for s in wrong_shape]
    )
    if problems:
        raise CheckpointError(f"checkpoint {model_dir} does not fit {config.model_type}: " + "; ".join(problems))
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()
