"""How one request wants its next tokens chosen."""

import math
from dataclasses import dataclass, field

from inference.tool_calls import ForcedToolCall


@dataclass
class SamplingParams:
    """Per-request sampling settings; ``temperature == 0`` means greedy.

    Validated on construction so a bad request fails at the API edge,
    not deep inside a batched sampler step.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 turns top-k off
    repetition_penalty: float = 1.0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    # The reply must be one of these texts (vLLM's guided choice): each step may only continue
    # one of them, and once one is left the rest of it is written without asking the model.
    choice: list[str] = field(default_factory=list)
    # How the reply is chosen among `choice`: "tokens" (constrained decoding, as above) or
    # "likelihood" (each reply read whole and scored by its mean token log-probability; the
    # best one, or one drawn at the temperature: inference.engine.choice_scoring)
    choice_scoring: str = "tokens"
    # With "likelihood": added to each choice's score (mean log-probability per token), one per
    # choice; a prior for or against a reply (e.g. the knowledge base's "not found")
    choice_bias: list[float] = field(default_factory=list)
    # The reply must be a call of one of these tools, written in the model's call format
    # (OpenAI's tool_choice "required" or a named function: inference.engine.tool_constraint)
    tool_call: ForcedToolCall | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(
                f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}"
            )
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if any(not isinstance(c, str) or not c.strip() for c in self.choice):
            raise ValueError("choice must be a list of non-empty strings")
        if self.choice_scoring not in ("tokens", "likelihood"):
            raise ValueError(f"choice_scoring must be 'tokens' or 'likelihood', got {self.choice_scoring!r}")
        if self.choice_bias:
            if self.choice_scoring != "likelihood" or len(self.choice_bias) != len(self.choice):
                raise ValueError("choice_bias needs choice_scoring='likelihood' and one number per choice")
            if not all(isinstance(b, (int, float)) and math.isfinite(b) for b in self.choice_bias):
                raise ValueError("choice_bias must be finite numbers")
        if self.tool_call is not None and (self.choice or self.ignore_eos):
            raise ValueError("a forced tool call cannot be combined with choice or ignore_eos")
        if self.choice and self.ignore_eos:
            raise ValueError("choice ends the reply with its text: it cannot ignore_eos")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0
