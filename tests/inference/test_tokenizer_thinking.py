"""The GLM-4.5+ chat layouts against the published templates, rendered as transformers renders them.

``tests/fixtures/glm45_chat_template.jinja`` is zai-org/GLM-4.5's ``chat_template.jinja`` (the
one GLM-4.5/4.6 ship, as embedded in their converted checkpoints) and
``glm47_chat_template.jinja`` is zai-org/GLM-4.7's (GLM-5's has the same text turns). Each test
renders a conversation with jinja2 in transformers' settings, tokenizes the text with the same
tokenizer (its added tokens split the text, as in ``apply_chat_template(tokenize=True)``), and
expects ``ChatTokenizer.apply_chat_template`` to give exactly those ids.
"""

import json
from pathlib import Path

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer

from inference.tokenizer import (
    GLM_SPECIAL_TOKENS,
    ChatTokenizer,
    build_glm_tokenizer,
    save_glm_tokenizer,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEMPLATES = {layout: (FIXTURES / f"{layout}_chat_template.jinja").read_text(encoding="utf-8")
             for layout in ("glm45", "glm47")}
THINK_TOKENS = ["<think>", "</think>", "/nothink"]
CORPUS = [
    "你好，请问有什么可以帮您？", "年假有十天，请提前三天申请。", "Let me think about the question.",
    "The user asks about leave. 用户问的是年假。", "Great job 👍 辛苦了 🎉", "hello\nworld\n\n",
]

CONVERSATIONS = {
    "one question": [{"role": "user", "content": "年假有几天？"}],
    "system and question": [
        {"role": "system", "content": "你是星河科技的企业助手。"},
        {"role": "user", "content": "How many days of leave? 👋"},
    ],
    "earlier answers lose their thinking": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "年假有几天？"},
        {"role": "assistant", "content": "<think>The user asks about leave.</think>\n年假有十天。"},
        {"role": "user", "content": "怎么申请？"},
        {"role": "assistant", "content": "\n<think>\n用户问申请流程\n</think>\n\n在系统里提交。 "},
        {"role": "user", "content": "谢谢"},
    ],
    "reasoning_content field": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "a greeting"},
        {"role": "user", "content": "again"},
    ],
    "a turn after the last question keeps its reasoning": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>a greeting</think>hello"},
        {"role": "assistant", "content": "more", "reasoning_content": "  still greeting \n"},
    ],
    "a close tag without an open tag": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "thinking only</think>answer"},
    ],
    "empty and blank messages are kept": [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "   "},
        {"role": "user", "content": "  spaces around  \n"},
    ],
    "content parts": [
        {"role": "user", "content": [{"type": "text", "text": "part one, "},
                                     {"type": "text", "text": "part two"}]},
    ],
    "the user already wrote /nothink": [{"role": "user", "content": "quick one /nothink"}],
}


def build_tokenizer(directory: Path, think_special: bool) -> None:
    tokenizer = build_glm_tokenizer(CORPUS * 20, vocab_size=500)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=think_special, normalized=False) for t in THINK_TOKENS])
    save_glm_tokenizer(tokenizer, directory)


@pytest.fixture(scope="module", params=[True, False], ids=["think-special", "think-plain"])
def model_dir(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("glm45_tokenizer")
    build_tokenizer(directory, think_special=request.param)
    return directory


def chat_tokenizer(model_dir: Path, layout: str) -> ChatTokenizer:
    tok = ChatTokenizer.from_pretrained(model_dir)
    return ChatTokenizer(tok.tokenizer, tok.eos_token_ids, layout)


def render(layout: str, messages: list[dict], **kwargs) -> str:
    """As transformers renders a chat template (its jinja2 environment settings)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    return env.from_string(TEMPLATES[layout]).render(messages=messages, **kwargs)


def template_ids(model_dir: Path, text: str) -> list[int]:
    """The rendered text tokenized: added tokens in the text become their ids."""
    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids


@pytest.mark.parametrize("layout", ["glm45", "glm47"])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("thinking", [None, True, False], ids=["default", "on", "off"])
@pytest.mark.parametrize("prompt", [True, False], ids=["prompt", "no-prompt"])
def test_ids_equal_the_published_template(model_dir, layout, name, thinking, prompt):
    messages = CONVERSATIONS[name]
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    text = render(layout, messages, add_generation_prompt=prompt, **kwargs)
    tok = chat_tokenizer(model_dir, layout)
    ours = tok.apply_chat_template(messages, add_generation_prompt=prompt, **kwargs)
    if name == "the user already wrote /nothink":
        # The template sees the user's own "/nothink" and adds none; its tokenizer would then
        # read the user's text as the control token, ours keeps what a user types as text.
        assert tok.decode(ours, skip_special_tokens=False) == text
        assert tok.tokenizer.token_to_id("/nothink") not in ours
        return
    assert ours == template_ids(model_dir, text), text
    assert tok.decode(ours, skip_special_tokens=False) == text


def test_the_layouts_as_text(model_dir):
    messages = CONVERSATIONS["earlier answers lose their thinking"][:4]
    glm45 = chat_tokenizer(model_dir, "glm45")
    glm47 = chat_tokenizer(model_dir, "glm47")

    def text(tok, **kwargs):
        return tok.decode(tok.apply_chat_template(messages, **kwargs), skip_special_tokens=False)

    assert text(glm45) == ("[gMASK]<sop><|system|>\nbe brief<|user|>\n年假有几天？"
                           "<|assistant|>\n<think></think>\n年假有十天。<|user|>\n怎么申请？<|assistant|>")
    assert text(glm45, enable_thinking=False).endswith(
        "<|user|>\n怎么申请？/nothink<|assistant|>\n<think></think>")
    assert text(glm47) == ("[gMASK]<sop><|system|>be brief<|user|>年假有几天？"
                           "<|assistant|></think>年假有十天。<|user|>怎么申请？<|assistant|><think>")
    assert text(glm47, enable_thinking=False).endswith("<|assistant|></think>")


def test_nothink_is_the_control_token_when_the_tokenizer_has_it(model_dir):
    tok = chat_tokenizer(model_dir, "glm45")
    ids = tok.apply_chat_template([{"role": "user", "content": "q"}], enable_thinking=False)
    assert tok.tokenizer.token_to_id("/nothink") in ids


def test_without_a_nothink_token_it_is_written_as_text(tmp_path):
    tokenizer = build_glm_tokenizer(CORPUS * 20, vocab_size=500)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in THINK_TOKENS[:2]])
    save_glm_tokenizer(tokenizer, tmp_path)
    tok = ChatTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "q"}]
    ids = tok.apply_chat_template(messages, enable_thinking=False)
    text = render("glm45", messages, add_generation_prompt=True, enable_thinking=False)
    assert ids == template_ids(tmp_path, text)


@pytest.mark.parametrize("tag", ["<think>", "</think>", "/nothink", "<|assistant|>"])
def test_tags_typed_by_a_user_stay_text(model_dir, tag):
    tok = chat_tokenizer(model_dir, "glm45")
    ids = tok.apply_chat_template([{"role": "user", "content": f"hi {tag} there"}])
    control = {tok.tokenizer.token_to_id(t) for t in [*GLM_SPECIAL_TOKENS, *THINK_TOKENS]}
    assert [tok.decode([i], skip_special_tokens=False) for i in ids if i in control] == [
        "[gMASK]", "<sop>", "<|user|>", "<|assistant|>"]


def test_other_roles_are_refused(model_dir):
    with pytest.raises(ValueError, match="function"):
        chat_tokenizer(model_dir, "glm45").apply_chat_template([{"role": "function", "content": "x"}])


# --- choosing the layout -------------------------------------------------------------------


def test_layout_follows_the_tokenizer_and_the_checkpoints_template(model_dir, tmp_path):
    assert ChatTokenizer.from_pretrained(model_dir).layout == "glm45"  # think tokens, no template
    for name in ("tokenizer.json", "generation_config.json"):
        (tmp_path / name).write_bytes((model_dir / name).read_bytes())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    for layout in ("glm45", "glm47"):
        (tmp_path / "tokenizer_config.json").write_text(
            json.dumps({**config, "chat_template": TEMPLATES[layout]}))
        assert ChatTokenizer.from_pretrained(tmp_path).layout == layout
    (tmp_path / "chat_template.jinja").write_text(TEMPLATES["glm47"])  # wins over the config's
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({**config, "chat_template": TEMPLATES["glm45"]}))
    assert ChatTokenizer.from_pretrained(tmp_path).layout == "glm47"


def test_a_tokenizer_without_think_tokens_keeps_the_glm4_layout(tmp_path):
    save_glm_tokenizer(build_glm_tokenizer(CORPUS * 20, vocab_size=400), tmp_path)
    tok = ChatTokenizer.from_pretrained(tmp_path)
    assert tok.layout == "glm4" and not tok.thinking
    with pytest.raises(ValueError, match="think"):
        ChatTokenizer(tok.tokenizer, tok.eos_token_ids, "glm45")


def test_where_a_reply_starts(model_dir):
    glm45, glm47 = chat_tokenizer(model_dir, "glm45"), chat_tokenizer(model_dir, "glm47")
    assert not glm45.reply_starts_thinking() and not glm45.reply_starts_thinking(False)
    assert glm47.reply_starts_thinking() and not glm47.reply_starts_thinking(False)


# --- decoding keeps the think part visible -------------------------------------------------


def test_decode_keeps_the_think_tags_and_skips_other_special_tokens(model_dir):
    tok = chat_tokenizer(model_dir, "glm45")
    ids = [tok.tokenizer.token_to_id(t) for t in ("<think>",)] + tok.encode("想一想") + [
        tok.tokenizer.token_to_id("</think>")] + tok.encode("\n答案") + [
        tok.tokenizer.token_to_id("<|user|>")]
    assert tok.decode(ids) == "<think>想一想</think>\n答案"
    assert tok.decode(ids, skip_special_tokens=False) == "<think>想一想</think>\n答案<|user|>"
    detok = tok.detokenizer()
    assert "".join(detok.push(i) for i in ids) + detok.flush() == "<think>想一想</think>\n答案"


def test_transformers_renders_the_same_ids(model_dir):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(model_dir)
    messages = CONVERSATIONS["earlier answers lose their thinking"]
    for layout in ("glm45", "glm47"):
        for thinking in (True, False):
            expected = hf.apply_chat_template(messages, chat_template=TEMPLATES[layout],
                                              tokenize=True, add_generation_prompt=True,
                                              enable_thinking=thinking)
            if isinstance(expected, dict) or hasattr(expected, "input_ids"):
                expected = expected["input_ids"]
            ours = chat_tokenizer(model_dir, layout).apply_chat_template(
                messages, enable_thinking=thinking)
            assert ours == list(expected), (layout, thinking)
