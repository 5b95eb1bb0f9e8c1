"""A tiny random GLM-4.5-style checkpoint for the tool-calling tests: a transformers
``Glm4MoeForCausalLM`` with random weights and a small GLM tokenizer that has the think and the
tool-call tags as tokens, as GLM-4.5's has. Its own text is noise; what it writes inside a
forced call (``tool_choice``) is held to the call format, so the calls it makes are real."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import AddedToken

from inference.tokenizer import build_glm_tokenizer, save_glm_tokenizer
from inference.tool_parser import TOOL_TAGS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS = ["你好，请问有什么可以帮您？", "查询北京的天气", "会议室 A 明天下午两点", "年假还有 5 天",
          "The user asks about leave.", "hello\nworld\n\n", '{"city": "北京", "days": 3}']
# GLM-4.5's added tokens beside the role tokens (think tags, /nothink, the tool-call tags)
EXTRA_TOKENS = ["<think>", "</think>", "/nothink", *TOOL_TAGS, "<tool_response>", "</tool_response>"]
EOS = ("<|endoftext|>", "<|user|>", "<|observation|>")  # GLM-4.5's generation_config eos ids


def write_tool_model(path: Path, layout: str = "glm45", seed: int = 0) -> Path:
    """The checkpoint in ``path``; ``layout`` "glm47" adds GLM-4.7's chat template, which makes
    the tokenizer lay prompts out as GLM-4.7 does."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    tokenizer = build_glm_tokenizer(CORPUS * 20, vocab_size=400)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in EXTRA_TOKENS])
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    eos = [tokenizer.token_to_id(t) for t in EOS]
    torch.manual_seed(seed)
    config = Glm4MoeConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, n_shared_experts=1,
        attention_bias=True, use_qk_norm=True, pad_token_id=eos[0], eos_token_id=eos,
        max_position_embeddings=4096)
    Glm4MoeForCausalLM(config).eval().save_pretrained(path)
    save_glm_tokenizer(tokenizer, path, EOS)
    if layout == "glm47":
        (path / "chat_template.jinja").write_text((FIXTURES / "glm47_chat_template.jinja").read_text())
    return path
