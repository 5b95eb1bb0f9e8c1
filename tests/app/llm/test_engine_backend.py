"""app/llm/engine_backend.py with a reasoning checkpoint: the prompt in the model's own chat layout
(``enable_thinking`` included) and the engine's text split into the think part and the answer.

The engine is replaced by a service that replays a scripted reply, piece by piece, as the
engine's step outputs do; the tokenizers are real.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tokenizers import AddedToken

from app.llm import GenerationParams
from app.llm.engine_backend import EngineBackend
from inference.tokenizer import ChatTokenizer, build_glm_tokenizer

CORPUS = ["你好，年假有十天。", "Let me think about leave.", "用户问年假"] * 20
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "年假有几天？"}]


def tokenizer(layout: str) -> ChatTokenizer:
    trained = build_glm_tokenizer(CORPUS, vocab_size=400)
    if layout != "glm4":
        trained.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t in ("<think>", "</think>", "/nothink")])
    return ChatTokenizer(trained, [0], layout)


class ScriptedService:
    """Answers every request with ``pieces``, one engine step each."""

    def __init__(self, tok: ChatTokenizer | None, pieces: list[str], finish: str = "stop"):
        self.engine = SimpleNamespace(tokenizer=tok)
        self.pieces, self.finish = pieces, finish
        self.prompts = []

    def submit(self, prompt, sampling):
        self.prompts.append(prompt)
        text = ""
        for step, piece in enumerate(self.pieces, 1):
            text += piece
            last = step == len(self.pieces)
            yield SimpleNamespace(delta=piece, text=text, prompt_tokens=len(prompt),
                                  completion_tokens=step * 2, cached_tokens=0,
                                  finish_reason=self.finish if last else None)


def run(service, params=GenerationParams()):
    deltas = list(EngineBackend(service, "glm").stream(MESSAGES, params))
    return deltas[:-1], deltas[-1].final


@pytest.mark.parametrize("layout, pieces", [
    ("glm45", ["\n<th", "ink>用户", "问年假</th", "ink>\n", "年假有", "十天。"]),
    ("glm47", ["用户", "问年假</", "think>年假有", "十天。"]),
])
def test_a_reasoning_models_answer_comes_without_its_thinking(layout, pieces):
    tok = tokenizer(layout)
    service = ScriptedService(tok, pieces)
    deltas, final = run(service)
    assert "".join(d.text for d in deltas) == final.text == "年假有十天。"
    assert "".join(d.reasoning for d in deltas) == final.reasoning == "用户问年假"
    assert all("用户" not in d.text and "think" not in d.text for d in deltas)
    assert final.completion_tokens == 2 * len(pieces)  # every generated token, thinking included
    assert service.prompts == [tok.apply_chat_template(MESSAGES)]


@pytest.mark.parametrize("layout", ["glm45", "glm47"])
def test_thinking_off_reaches_the_prompt(layout):
    tok = tokenizer(layout)
    service = ScriptedService(tok, ["年假有十天。"])
    _, final = run(service, GenerationParams(enable_thinking=False))
    assert service.prompts == [tok.apply_chat_template(MESSAGES, enable_thinking=False)]
    assert service.prompts[0] != tok.apply_chat_template(MESSAGES)
    assert final.text == "年假有十天。" and final.reasoning == ""


def test_thinking_cut_off_by_max_tokens_leaves_no_answer():
    service = ScriptedService(tokenizer("glm45"), ["<think>用户问", "年假，想了很久"], finish="length")
    deltas, final = run(service)
    assert final.text == "" and final.reasoning == "用户问年假，想了很久"
    assert final.finish_reason == "length" and not any(d.text for d in deltas)


def test_a_model_without_think_tokens_is_passed_through():
    tok = tokenizer("glm4")
    service = ScriptedService(tok, ["<think>是", "字面文字"])  # the demo never thinks
    deltas, final = run(service)
    assert [d.text for d in deltas] == ["<think>是", "字面文字"] and final.text == "<think>是字面文字"
    assert final.reasoning == ""
    assert service.prompts == [tok.apply_chat_template(MESSAGES)]


def test_token_ids_are_submitted_as_they_are():
    service = ScriptedService(tokenizer("glm45"), ["ok"])
    list(EngineBackend(service, "glm").stream([5, 6, 7], GenerationParams()))
    assert service.prompts == [[5, 6, 7]]


def test_a_glm4_moe_checkpoint_runs_through_the_real_engine(tmp_path):
    """The worker's backend on a GLM-4.5-style MoE checkpoint (made by transformers) with a
    tokenizer that has the think tokens: the answer is the engine's own greedy continuation of the
    prompt in the model's chat layout, split from any think part."""
    import torch
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    from inference.engine.sequence import TextOut
    from inference.llm import LLM
    from inference.reasoning import ReasoningSplitter
    from inference.sampling_params import SamplingParams
    from inference.tokenizer import save_glm_tokenizer
    from tests.inference.helpers import reference_tokens

    tok = tokenizer("glm45")
    torch.manual_seed(0)
    config = Glm4MoeConfig(vocab_size=tok.vocab_size, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=12, moe_intermediate_size=16,
                           n_routed_experts=6, num_experts_per_tok=2, first_k_dense_replace=1,
                           initializer_range=0.2)
    Glm4MoeForCausalLM(config).save_pretrained(tmp_path)
    save_glm_tokenizer(tok.tokenizer, tmp_path)
    settings = SimpleNamespace(model_dir=str(tmp_path), engine_max_num_seqs=4, engine_max_model_len=256,
                               engine_kv_cache_bytes=8 << 20, engine_speculative_k=0)
    backend = EngineBackend.from_settings(settings)
    try:
        result = backend.generate(MESSAGES, GenerationParams(max_tokens=12, temperature=0))
    finally:
        backend.close()
    llm = LLM.from_pretrained(tmp_path, device="cpu", kv_cache_bytes=8 << 20)
    prompt = llm.tokenizer.apply_chat_template(MESSAGES)
    # the model's own greedy tokens on one sequence's cache, rendered as the engine renders them
    expected = reference_tokens(llm.model, prompt, SamplingParams(temperature=0, max_tokens=12), llm.eos_token_ids)
    out = TextOut(llm.tokenizer, [])
    text = "".join(out.push(t) for t in expected if t not in llm.eos_token_ids) + out.flush()
    splitter = ReasoningSplitter("thinking" if llm.tokenizer.reply_starts_thinking() else "answer")
    splitter.feed(text)
    splitter.finish()
    assert result.prompt_tokens == len(prompt) and result.completion_tokens == len(expected)
    assert (result.text, result.reasoning) == (splitter.answer, splitter.reasoning)
    assert result.text or result.reasoning
