"""Minimal private stand-ins for the modules another engineer writes in parallel
(`inference.sampling_params`, `inference.layers.sampler`, `inference.tokenizer`), installed by
conftest only while those modules are missing, following the agreed API."""

import types
from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False


class Sampler:
    """Greedy at temperature 0, otherwise plain temperature sampling (enough for these tests)."""

    def probs(self, logits, params, history):
        temps = torch.tensor([max(p.temperature, 1e-5) for p in params])[:, None]
        return torch.softmax(logits.float() / temps, dim=-1)

    def __call__(self, logits, params, history, generators):
        out = []
        probs = self.probs(logits, params, history)
        for row, p, g in zip(probs, params, generators, strict=True):
            if p.temperature == 0:
                out.append(int(row.argmax()))
            else:
                out.append(int(torch.multinomial(row, 1, generator=g)))
        return torch.tensor(out)


class StopStringMatcher:
    """Emits text as soon as it cannot be the start of a stop string; stops at the first one."""

    def __init__(self, stop):
        self.stop, self.buffer = list(stop), ""

    def feed(self, text):
        self.buffer += text
        hits = [i for i in (self.buffer.find(s) for s in self.stop) if i >= 0]
        if hits:
            return self.buffer[: min(hits)], True
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.buffer)), 0, -1):
                if self.buffer.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        emit = self.buffer[: len(self.buffer) - hold]
        self.buffer = self.buffer[len(emit) :]
        return emit, False


class ChatTokenizer:
    @classmethod
    def from_pretrained(cls, model_dir):
        raise NotImplementedError("stand-in: the real tokenizer lands from another branch")


def modules() -> dict[str, types.ModuleType]:
    built = {}
    for name, members in {
        "inference.sampling_params": {"SamplingParams": SamplingParams},
        "inference.layers.sampler": {"Sampler": Sampler},
        "inference.tokenizer": {"ChatTokenizer": ChatTokenizer, "StopStringMatcher": StopStringMatcher},
    }.items():
        module = types.ModuleType(name)
        module.__dict__.update(members)
        built[name] = module
    return built
