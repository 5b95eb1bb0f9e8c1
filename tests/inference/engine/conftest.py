import pytest
import torch

from inference.config import ModelConfig
from inference.engine import EngineArgs, LLMEngine
from inference.layers.caches.layouts import cache_layout
from inference.sampling_params import SamplingParams
from tests.inference.helpers import reference_tokens
from tests.inference.test_kv_cache import build

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    """Tiny routed GLM-5 sparse model, W=16, G=4."""
    torch.manual_seed(0)
    return build()


def engine_for(model, num_blocks: int = 64, **kwargs) -> LLMEngine:
    per_block = cache_layout(model.config).bytes_per_block(kwargs.get("block_size", 64), torch.float32)
    return LLMEngine(model, args=EngineArgs(kv_cache_bytes=num_blocks * per_block, **kwargs), eos_token_ids=[])


def reference(model, prompts, params=GREEDY) -> list[list[int]]:
    """Each prompt decoded alone on the model's one-sequence cache (no eos)."""
    return [reference_tokens(model, p, params) for p in prompts]


def random_prompts(count: int, low: int, high: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=g).tolist()
    return [torch.randint(3, 128, (n,), generator=g).tolist() for n in lengths]


__all__ = ["GREEDY", "ModelConfig", "engine_for", "random_prompts", "reference"]
