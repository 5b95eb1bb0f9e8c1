"""Generation behaviour the engine owns, through `LLM`: eos list, max tokens, stop strings,
streaming, seeds, chunked prefill."""

import codecs
import types

import pytest
import torch

from inference.config import ModelConfig
from inference.engine import EngineArgs
from inference.llm import LLM
from inference.sampling_params import SamplingParams
from tests.inference.helpers import glm5_config, reference_tokens, write_checkpoint

EOS = 1


class ByteDetokenizer:
    def __init__(self):
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def push(self, token):
        return self.decoder.decode(bytes([token - 10])) if token >= 10 else ""

    def flush(self):
        return self.decoder.decode(b"", final=True)


class ByteTokenizer:
    """Token 10 + b is byte b; ids below 10 are special."""

    eos_token_ids = [EOS]

    def encode(self, text):
        return [10 + b for b in text.encode()]

    def detokenizer(self):
        return ByteDetokenizer()


class ScriptedModel:
    """Emits a fixed continuation: the logits after position p favour script[p + 1 - prompt]. It
    stands where the engine's model stands (its config sizes the cache; its forward ignores it)."""

    device = torch.device("cpu")

    def __init__(self, script, prompt_len, vocab=300):
        self.script, self.prompt_len, self.vocab = script, prompt_len, vocab
        self.config = ModelConfig.from_dict(glm5_config(vocab_size=vocab, num_mtp_heads=0))
        self.model = types.SimpleNamespace(embed_tokens=types.SimpleNamespace(weight=torch.zeros(1)))
        self.forwarded = []

    def __call__(self, ids, positions, cache):
        self.forwarded.extend(ids.tolist())
        return positions.float()[:, None]

    def compute_logits(self, hidden):
        logits = torch.zeros(hidden.shape[0], self.vocab)
        for row, p in enumerate(hidden[:, 0].long().tolist()):
            logits[row, self.script[p + 1 - self.prompt_len]] = 10.0
        return logits


def scripted_llm(text_ids, prompt="hi"):
    tok = ByteTokenizer()
    prompt_ids = tok.encode(prompt)
    return LLM(ScriptedModel(text_ids, len(prompt_ids)), tok, EngineArgs(kv_cache_bytes=1 << 20), [EOS]), prompt_ids


GREEDY = dict(temperature=0)


def test_stops_on_any_eos_of_the_list():
    tok = ByteTokenizer()
    script = tok.encode("ok") + [2] + tok.encode("never")
    llm, prompt = scripted_llm(script)
    llm.eos_token_ids = {EOS, 2}
    result = llm.generate([prompt], SamplingParams(**GREEDY, max_tokens=50))[0]
    assert result.text == "ok" and result.finish_reason == "stop"
    assert result.token_ids == script[:3] and result.completion_tokens == 3
    assert result.prompt_tokens == len(prompt)


def test_ignore_eos_and_max_tokens():
    tok = ByteTokenizer()
    script = tok.encode("a") + [EOS] + tok.encode("bcdefgh")
    llm, prompt = scripted_llm(script)
    result = llm.generate([prompt], SamplingParams(**GREEDY, max_tokens=4, ignore_eos=True))[0]
    assert result.token_ids == script[:4] and result.finish_reason == "length"
    assert result.text == "abc"
    assert len(llm.model.forwarded) == len(prompt) + 3  # no forward for a token never sampled


def test_stop_string_cuts_text_across_tokens():
    tok = ByteTokenizer()
    llm, prompt = scripted_llm(tok.encode("Hello END world"))
    result = llm.generate([prompt], SamplingParams(**GREEDY, max_tokens=50, stop=["END"]))[0]
    assert result.text == "Hello " and result.finish_reason == "stop"


def test_held_back_stop_prefix_is_released_at_the_end():
    tok = ByteTokenizer()
    llm, prompt = scripted_llm(tok.encode("value EN"))
    result = llm.generate([prompt], SamplingParams(**GREEDY, max_tokens=8, stop=["END"]))[0]
    assert result.text == "value EN" and result.finish_reason == "length"


def test_stream_deltas_add_up_and_never_split_a_character():
    tok = ByteTokenizer()
    llm, prompt = scripted_llm(tok.encode("你好, world") + [EOS])
    outputs = list(llm.stream(prompt, SamplingParams(**GREEDY, max_tokens=50)))
    deltas = [o.delta for o in outputs if o.delta]
    assert "".join(deltas) == "你好, world" == outputs[-1].text and outputs[-1].finished
    assert deltas[:2] == ["你", "好"]


def test_a_stream_closed_early_aborts_its_request():
    tok = ByteTokenizer()
    llm, prompt = scripted_llm(tok.encode("abcdefgh"))
    stream = llm.stream(prompt, SamplingParams(**GREEDY, max_tokens=50))
    assert next(stream).delta == "a"
    stream.close()
    assert not llm.has_unfinished_requests() and not llm.requests


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("glm5"), glm5_config())


@pytest.fixture(scope="module")
def tiny_llm(checkpoint):
    return LLM.from_pretrained(checkpoint, kv_cache_bytes=1 << 22)


def test_seed_makes_sampling_reproducible(tiny_llm):
    params = dict(temperature=1.0, max_tokens=24, ignore_eos=True)
    a = tiny_llm.generate([[5, 6, 7]], SamplingParams(**params, seed=7))[0].token_ids
    b = tiny_llm.generate([[5, 6, 7]], SamplingParams(**params, seed=7))[0].token_ids
    c = tiny_llm.generate([[5, 6, 7]], SamplingParams(**params, seed=8))[0].token_ids
    assert a == b and a != c and len(a) == 24
    assert a == reference_tokens(tiny_llm.model, [5, 6, 7], SamplingParams(**params, seed=7))


def test_long_prompt_prefills_in_chunks(checkpoint, tiny_llm):
    chunked = LLM.from_pretrained(checkpoint, kv_cache_bytes=1 << 22, max_num_batched_tokens=16)
    prompt = torch.randint(3, 128, (70,)).tolist()
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    assert chunked.generate([prompt], params)[0].token_ids == tiny_llm.generate([prompt], params)[0].token_ids


def test_token_only_engine_refuses_text_and_stop_strings(tiny_llm):
    with pytest.raises(ValueError, match="tokenizer"):
        tiny_llm.generate(["text"])
    with pytest.raises(ValueError, match="stop strings"):
        tiny_llm.generate([[5]], SamplingParams(stop=["x"]))


def test_one_prompt_not_in_a_list_is_a_clear_error(tiny_llm):
    """`generate` runs a batch: token ids or a string passed bare would read as many prompts."""
    with pytest.raises(TypeError, match="list of prompts"):
        tiny_llm.generate([5, 6, 7])
    with pytest.raises(TypeError, match="list of prompts"):
        tiny_llm.generate("hello")
