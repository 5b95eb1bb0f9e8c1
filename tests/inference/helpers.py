"""Tiny checkpoints for the engine tests, and the one-sequence reference the engine is held to."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from inference.config import ModelConfig
from inference.layers.sampler import Sampler, generator_for
from inference.loader import checkpoint_state_dict
from inference.models import MODELS
from inference.sampling_params import SamplingParams


def glm5_config(**overrides) -> dict:
    raw = {
        "model_type": "glm5_sparse",
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        "sliding_window": 16,
        "global_interval": 4,
        "route_threshold": 0.2,
        "num_mtp_heads": 1,
        "eos_token_id": [1, 2],
        "dtype": "float32",
    }
    raw.update(overrides)
    return raw


def random_state(config: ModelConfig) -> dict[str, torch.Tensor]:
    """Random weights under their checkpoint names, with non-trivial norms so that every
    parameter matters."""
    model = MODELS[config.model_type](config)
    state = {}
    for name, p in checkpoint_state_dict(model).items():
        if name.endswith("norm.weight"):
            state[name] = 1 + 0.3 * torch.randn_like(p)
        elif name.endswith("router.weight"):
            state[name] = 2 * torch.randn_like(p)  # spread routes so some fall under the threshold
        else:
            state[name] = p.detach().clone()
    return state


def write_checkpoint(path: Path, raw_config: dict, state: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(raw_config))
    if state is None:
        state = random_state(ModelConfig.from_dict(raw_config))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    return path


def unsettle_(hf: torch.nn.Module) -> torch.nn.Module:
    """A transformers GLM MoE model with its router correction biases and norm weights moved off
    their neutral init (zeros, ones), so that every one of them changes the experts chosen or
    what they give; returns it."""
    with torch.no_grad():
        for name, buffer in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0, 0.5)
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1, 0.3)
    return hf


def with_mtp_layer(state: dict[str, torch.Tensor], last: int, hidden: int, copy: str) -> dict[str, torch.Tensor]:
    """`state` plus an MTP layer as the published GLM checkpoints store it, at index `last + 1`:
    a copy of decoder layer `last`, zero `eh_proj`, unit norms, and `copy` ("embed_tokens" or
    "shared_head.head"), one of the copies of the model's tensors the loader does not read."""
    mtp = {k.replace(f"model.layers.{last}.", f"model.layers.{last + 1}."): v.clone() for k, v in state.items()
           if k.startswith(f"model.layers.{last}.")}
    mtp[f"model.layers.{last + 1}.eh_proj.weight"] = torch.zeros(hidden, 2 * hidden)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        mtp[f"model.layers.{last + 1}.{norm}.weight"] = torch.ones(hidden)
    source = {"embed_tokens": "model.embed_tokens.weight", "shared_head.head": "lm_head.weight"}[copy]
    mtp[f"model.layers.{last + 1}.{copy}.weight"] = state[source].clone()
    return {**state, **mtp}


@torch.inference_mode()
def reference_tokens(model, prompt: list[int], params: SamplingParams, eos_token_ids=(), chunk: int = 2048,
                     cache=None) -> list[int]:
    """The completion of one prompt decoded on the model's own one-sequence cache
    (`model.new_cache()`, contiguous: no pages, no batch, no drafts): the prompt in chunks of
    `chunk`, then a token a step, sampled as the engine samples (the request's seeded generator);
    a token of `eos_token_ids` ends it (and is kept) unless `params.ignore_eos`. Every engine path
    (paged, batched, chunked, prefix-cached, speculative) must give exactly these tokens."""
    device, sampler = model.device, Sampler()
    generator = generator_for(params, device)
    cache = model.new_cache() if cache is None else cache
    for a in range(0, len(prompt), chunk):
        ids = torch.tensor(prompt[a : a + chunk], device=device)
        hidden = model(ids, torch.arange(a, a + len(ids), device=device), cache)
    logits, history, out = model.compute_logits(hidden[-1:]), list(prompt), []
    while len(out) < params.max_tokens:
        token = int(sampler(logits, [params], [history], [generator])[0])
        history.append(token)
        out.append(token)
        if token in eos_token_ids and not params.ignore_eos:
            break
        ids, positions = torch.tensor([token], device=device), torch.tensor([len(history) - 1], device=device)
        logits = model.compute_logits(model(ids, positions, cache))
    return out
