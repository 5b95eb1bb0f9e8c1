"""Load a model from a safetensors checkpoint directory (single file or sharded by index)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from inference.config import ModelConfig, default_device, serving_dtype
from inference.layers.linear import PackedLinear, input_major, quantize_linears_
from inference.models import MODELS, cpu_fast_path
from inference.models.glm5_sparse import Glm5SparseForCausalLM

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SCALE_SUFFIX = "_scale"  # a W8A16 checkpoint: int8 `X.weight` beside fp32 `X.weight_scale`
# FP8 releases (GLM-4.5-FP8 ... GLM-5-FP8, DeepSeek-V3's format): e4m3 `X.weight` beside the fp32
# factors `X.weight_scale_inv` that multiply it back, one per block of `weight_block_size`
# (config.json's `quantization_config`, 128 x 128), per output row, or one for the tensor.
FP8_SCALE_SUFFIX = "_scale_inv"
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


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


def checkpoint_layout(model: nn.Module) -> dict[str, list[tuple[str, torch.Size]]]:
    """Model parameter -> the checkpoint tensors (name, shape) stacked along dim 0 to make it.

    Most parameters are one tensor under their own name; a `PackedLinear` such as
    `self_attn.qkv_proj` is made of its sibling parts (`self_attn.q_proj`, ...)."""
    rename = getattr(model, "checkpoint_name", lambda name: name)  # glm4_moe's MTP layers
    layout = {name: [(rename(name), p.shape)] for name, p in model.named_parameters()}  # tied: once
    for module_name, module in model.named_modules():
        if not isinstance(module, PackedLinear):
            continue
        parent = module_name.rpartition(".")[0]
        for kind in ("weight", "bias"):
            param = getattr(module, kind)
            if param is not None:
                layout[f"{module_name}.{kind}"] = [
                    (rename(f"{parent}.{part}.{kind}"), torch.Size((rows, *param.shape[1:])))
                    for part, rows in module.parts.items()
                ]
    return layout


def checkpoint_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under their checkpoint names (packed layers split into their parts)."""
    params = dict(model.named_parameters())
    state = {}
    for name, parts in checkpoint_layout(model).items():
        pieces = params[name].detach().split([shape[0] for _, shape in parts])
        state.update({part: piece for (part, _), piece in zip(parts, pieces, strict=True)})
    return state


def load_model(
    model_dir: str | Path, config: ModelConfig, device: torch.device | str | None = None
) -> Glm5SparseForCausalLM:
    """Build the model of `config.model_type` and fill it from the checkpoint.

    The model is built on the meta device (no wasted random init) and each tensor is read once,
    cast to `config.dtype` and placed on `device` (CUDA when present, else CPU). Every missing,
    unexpected or mis-shaped tensor is reported by name in one `CheckpointError`. With tied
    embeddings `lm_head.weight` is optional and, when present, ignored. int8 (W8A16) and fp8
    checkpoints are dequantized as read; the model's `fp32_suffixes` (GLM's MoE router) stay
    fp32; tensors under its `skipped_checkpoint_prefixes` (layers it does not run) are not read.
    A model type whose published checkpoints carry MTP layers (`mtp_heads_in_checkpoint`) gets
    `config.num_mtp_heads` set, in place, to the count this checkpoint has. On CUDA an fp32
    checkpoint whose dtype the caller did not choose loads in bf16 (`config.dtype`, in place),
    as vLLM's "auto" halves fp32 checkpoints: the GPU path is built for 16-bit weights.
    On the CPU the fast path of `cpu_fast_path` is installed on the layers it knows.
    """
    model_dir, device = Path(model_dir), torch.device(device or default_device())
    config.dtype = serving_dtype(config, device)
    model_class = MODELS[config.model_type]
    every_file = checkpoint_files(model_dir)
    found = getattr(model_class, "mtp_heads_in_checkpoint", None)
    if found is not None:  # MTP layers of a published checkpoint: what it carries (in place)
        config.num_mtp_heads = found(config, every_file.keys())
    with torch.device("meta"):
        model = model_class(config)
    layout = checkpoint_layout(model)
    expected = {name: shape for parts in layout.values() for name, shape in parts}
    skipped = model_class.skipped_checkpoint_prefixes(config)
    files = {n: f for n, f in every_file.items() if not n.startswith(skipped)}
    optional = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = sorted(set(expected) - set(files))
    scales = {n for n in files if n.endswith((SCALE_SUFFIX, FP8_SCALE_SUFFIX))
              and n.removesuffix(FP8_SCALE_SUFFIX).removesuffix(SCALE_SUFFIX) in expected}
    unexpected = sorted(set(files) - set(expected) - optional - scales)
    block = fp8_block_size(model_dir)
    tensors, wrong_shape = {}, []
    by_file: dict[Path, list[str]] = {}
    for name in sorted(expected.keys() & files.keys()):
        by_file.setdefault(files[name], []).append(name)
    for path, names in by_file.items():
        with safe_open(path, framework="pt", device=str(device)) as f:
            for name in names:
                tensor = f.get_tensor(name)
                if tensor.dtype == torch.int8 and name + SCALE_SUFFIX in scales:
                    # Dequantized exactly (fp32); `quantize_linears_` below gives back the same int8.
                    scale = safe_open_tensor(files[name + SCALE_SUFFIX], name + SCALE_SUFFIX, device)
                    tensor = tensor.float() * scale.float()[:, None]
                elif tensor.dtype in FP8_DTYPES:
                    factors = None
                    if name + FP8_SCALE_SUFFIX in scales:
                        factors = safe_open_tensor(files[name + FP8_SCALE_SUFFIX], name + FP8_SCALE_SUFFIX, device)
                    tensor = dequantize_fp8(tensor, factors, block)
                if tensor.shape != expected[name]:
                    wrong_shape.append(f"{name}: checkpoint {tuple(tensor.shape)}, model {tuple(expected[name])}")
                keep_fp32 = name.endswith(model_class.fp32_suffixes) if model_class.fp32_suffixes else False
                tensors[name] = tensor.to(torch.float32 if keep_fp32 else config.dtype)
    problems = (
        [f"missing tensor {n}" for n in missing]
        + [f"unexpected tensor {n}" for n in unexpected]
        + [f"mis-shaped tensor {s}" for s in wrong_shape]
    )
    if problems:
        raise CheckpointError(f"checkpoint {model_dir} does not fit {config.model_type}: " + "; ".join(problems))
    state = {
        name: tensors[parts[0][0]] if len(parts) == 1 else torch.cat([tensors[p] for p, _ in parts])
        for name, parts in layout.items()
    }
    model.load_state_dict(state, strict=False, assign=True)
    if device.type == "cpu" and config.dtype == torch.float32:
        store_input_major_(model)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    if config.quantization == "w8a16":
        quantize_linears_(model)
    if device.type == "cpu":
        cpu_fast_path.install_(model)
    return model.eval()


def fp8_block_size(model_dir: Path) -> tuple[int, int] | None:
    """`quantization_config.weight_block_size` of an FP8 checkpoint's config.json, if any."""
    config = json.loads((model_dir / "config.json").read_text())
    size = (config.get("quantization_config") or {}).get("weight_block_size")
    return None if size is None else (int(size[0]), int(size[1]))


def dequantize_fp8(weight: torch.Tensor, factors: torch.Tensor | None, block: tuple[int, int] | None) -> torch.Tensor:
    """An fp8 weight `[out, in]` times its factors, in fp32: one factor per `block` (the last
    blocks of a row or column may be partial), per output row (`[out]` or `[out, 1]`), or one
    for the whole tensor (a scalar, or none at all)."""
    values = weight.float()
    if factors is None or factors.numel() == 1:
        return values if factors is None else values * factors.float().reshape(())
    factors = factors.float()
    out, cols = weight.shape
    # with the config's block size, a grid one tile wide (a weight of at most one block's columns)
    # is blocks, not one factor per row
    tiles = None if block is None else (-(-out // block[0]), -(-cols // block[1]))
    if factors.dim() == 2 and factors.shape == tiles:
        return values * factors.repeat_interleave(block[0], 0)[:out].repeat_interleave(block[1], 1)[:, :cols]
    if factors.dim() == 1 or factors.shape[1] == 1:
        if factors.shape[0] != out:
            raise CheckpointError(f"fp8 row factors {tuple(factors.shape)} for a weight {tuple(weight.shape)}")
        return values * factors.reshape(out, 1)
    if block is None:  # no block size in the config: the one the factor grid implies
        block = (-(-out // factors.shape[0]), -(-cols // factors.shape[1]))
    if factors.shape != (-(-out // block[0]), -(-cols // block[1])):
        raise CheckpointError(f"fp8 block factors {tuple(factors.shape)} do not cover a weight "
                              f"{tuple(weight.shape)} in blocks of {block}")
    grid = factors.repeat_interleave(block[0], 0)[:out].repeat_interleave(block[1], 1)[:, :cols]
    return values * grid


def store_input_major_(model: nn.Module) -> None:
    """Lay every linear weight out input-major, the layout fp32 CPU matmuls read fastest (see
    `inference.layers.linear`); tied weights are left to the embedding, whose row lookups want
    the checkpoint's layout."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            weight = module.weight
            module.weight = nn.Parameter(input_major(weight.detach()), requires_grad=weight.requires_grad)


def safe_open_tensor(path: Path, name: str, device: torch.device) -> torch.Tensor:
    with safe_open(path, framework="pt", device=str(device)) as f:
        return f.get_tensor(name)
