"""Text in, token ids out, and back again: the GLM chat formats and streaming decode.

Built on HF ``tokenizers`` alone so the engine never imports ``transformers``.

Three chat layouts, chosen by what the tokenizer has (``ChatTokenizer.layout``):

- ``glm4``: GLM-4's template (THUDM/glm-4-9b-chat), for tokenizers without think tokens, such
  as the bundled demo's;
- ``glm45``: GLM-4.5/4.6's (zai-org/GLM-4.5 ``chat_template.jinja``), for tokenizers with the
  ``<think>``/``</think>`` tokens: a newline after every role token, each earlier assistant turn
  as ``\\n<think></think>\\n{answer}``, the reply left to open its own think part; thinking off
  appends ``/nothink`` to every user turn and pre-fills an empty think part;
- ``glm47``: GLM-4.7/GLM-5's, the same turns without the newlines, earlier assistant turns as
  ``</think>{answer}``, and the generation prompt pre-filling ``<think>`` (``</think>`` with
  thinking off). ``from_pretrained`` picks it when the checkpoint's own template has no
  ``/nothink``.
"""

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

from inference import tool_prompt
from inference.tool_parser import TOOL_TAGS
from inference.tool_prompt import Markup

# Fixed low ids 0..9, in this order, for every tokenizer we train.
GLM_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
]
# GLM-4 ends an assistant turn by starting the next speaker's turn.
GLM_EOS_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
CHAT_ROLES = ("system", "user", "assistant", "observation")
# GLM-4's chat template (THUDM/glm-4-9b-chat) minus the tools preamble; written into
# tokenizer_config.json so HF tooling renders the same layout as apply_chat_template.
GLM_CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for item in messages %}{% if item['content'] %}"
    "<|{{ item['role'] }}|>{{ item['metadata'] }}\n{{ item['content'] }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


THINK_OPEN, THINK_CLOSE, NO_THINK = "<think>", "</think>", "/nothink"
LAYOUTS = ("glm4", "glm45", "glm47")
THINKING_ROLES = ("system", "user", "assistant", "tool")


class Special(str):
    """A control token in a rendered turn: entered by id, never encoded from text."""


@dataclass(frozen=True)
class ThinkingLayout:
    """What the GLM-4.5 and GLM-4.7 templates write around the text of a conversation."""

    newline: str  # after <|system|> and <|user|>, before an assistant turn's parts
    empty_think: tuple[str, ...]  # an assistant turn whose reasoning is dropped
    prompt_thinking: tuple[str, ...]  # after the last <|assistant|>, thinking on
    prompt_not_thinking: tuple[str, ...]  # ... thinking off
    user_nothink: bool  # thinking off also ends every user turn with /nothink


_OPEN, _CLOSE = Special(THINK_OPEN), Special(THINK_CLOSE)
THINKING_LAYOUTS = {
    "glm45": ThinkingLayout("\n", ("\n", _OPEN, _CLOSE), (), ("\n", _OPEN, _CLOSE), True),
    "glm47": ThinkingLayout("", (_CLOSE,), (_OPEN,), (_CLOSE,), False),
}


class ChatTokenizer:
    """A trained tokenizer plus its GLM chat layout and the ids that end a reply.

    Takes ownership of ``tokenizer``: it is switched to treat all text as plain text.
    ``layout`` (see the module docstring) defaults to ``glm45`` when the tokenizer has the
    think tokens, else ``glm4``.
    """

    def __init__(self, tokenizer: Tokenizer, eos_token_ids: list[int], layout: str | None = None):
        # Text is always plain text: a literal "<|assistant|>" typed by a user must not
        # become the role token. Special tokens enter only by id, in apply_chat_template.
        tokenizer.encode_special_tokens = True
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        has_think = all(tokenizer.token_to_id(t) is not None for t in (THINK_OPEN, THINK_CLOSE))
        layout = layout or ("glm45" if has_think else "glm4")
        if layout not in LAYOUTS:
            raise ValueError(f"unknown chat layout {layout!r}; expected one of {LAYOUTS}")
        if layout != "glm4" and not has_think:
            raise ValueError(f"the {layout} layout needs the {THINK_OPEN} and {THINK_CLOSE} tokens")
        self.layout = layout
        self._prefix = [self._special_id("[gMASK]"), self._special_id("<sop>")]
        self._role_ids = {
            role: self._special_id(f"<|{role}|>")
            for role in CHAT_ROLES
            if tokenizer.token_to_id(f"<|{role}|>") is not None
        }
        # Decoding skips special tokens but keeps the think and tool-call tags, which a tokenizer
        # may mark special too: the reply's think part and calls must stay visible to whoever
        # splits them off.
        kept_ids = {tokenizer.token_to_id(t) for t in (THINK_OPEN, THINK_CLOSE, *TOOL_TAGS)}
        added = tokenizer.get_added_tokens_decoder()
        self._skipped_ids = None
        if self.thinking:
            self._skipped_ids = {i for i, t in added.items() if t.special and i not in kept_ids}
        # The template's own text is split at the added tokens, as a tokenizer splits a rendered
        # prompt (longest first); what clients and tools wrote never is.
        contents = sorted((t.content for t in added.values()), key=len, reverse=True)
        self._added = re.compile("|".join(map(re.escape, contents))) if contents else None

    @property
    def thinking(self) -> bool:
        """Does this model write a think part before its answer?"""
        return self.layout != "glm4"

    def reply_starts_thinking(self, enable_thinking: bool = True) -> bool:
        """Does a reply to ``apply_chat_template(..., enable_thinking)`` begin inside a think
        part the prompt opened (GLM-4.7 and later), so that it holds only ``</think>``?"""
        return self.layout == "glm47" and enable_thinking

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "ChatTokenizer":
        model_dir = Path(model_dir)
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config = read_json(model_dir / "tokenizer_config.json")
        generation = read_json(model_dir / "generation_config.json")
        eos = generation.get("eos_token_id")
        if eos is None and config.get("eos_token"):
            eos = tokenizer.token_to_id(token_content(config["eos_token"]))
        if eos is None:
            raise ValueError(f"{model_dir}: no eos_token_id in generation_config.json or eos_token")
        layout = None
        template = chat_template_of(model_dir, config)
        if template and THINK_OPEN in template and NO_THINK not in template:
            layout = "glm47"  # its own template pre-fills <think> and has no /nothink switch
        return cls(tokenizer, [eos] if isinstance(eos, int) else list(eos), layout)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens and self._skipped_ids is not None:
            ids = [i for i in ids if i not in self._skipped_ids]
            skip_special_tokens = False
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def role_id(self, role: str) -> int:
        """The special token that opens a message of `role` (a trainer lays replies out by hand)."""
        return self._role_ids[role]

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, enable_thinking: bool = True,
        tools: list[dict] | None = None,
    ) -> list[int]:
        """The prompt's ids, laid out as the model's own chat template renders it.

        ``enable_thinking=False`` does what the template does for it (GLM-4.5+; GLM-4 has no
        think part and ignores it). ``tools`` (OpenAI's tool dicts), assistant turns with
        ``tool_calls`` and ``tool`` turns are laid out as GLM-4.5+ templates do
        (``inference.tool_prompt``); GLM-4's layout has no tool format here and refuses them.
        """
        if self.thinking:
            return self._thinking_template(messages, add_generation_prompt, enable_thinking, tools or [])
        if tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
            raise ValueError("tools need a GLM-4.5 or later chat format; this model's (GLM-4) has none")
        return self._glm4_template(messages, add_generation_prompt)

    @property
    def has_tool_tokens(self) -> bool:
        """Are the tool-call tags single tokens (as in GLM-4.5+), so a call can be forced token by token?"""
        return all(self.tokenizer.token_to_id(t) is not None for t in TOOL_TAGS)

    def reply_ids(self, text: str) -> list[int]:
        """A whole reply's tokens as the model writes them after ``<|assistant|>`` (GLM-4's
        layout: a newline, then the text), for decoding constrained to given replies."""
        if self.thinking:
            raise ValueError("a reply constrained to given texts needs a model without a think part")
        return self.encode(f"\n{text}")

    def _glm4_template(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        """``[gMASK]<sop><|role|>{metadata}\\n{content}...<|assistant|>``, as GLM-4 renders it.

        Like the reference template, a message with empty content is left out, and the
        generation prompt has no newline: the model writes that itself.
        """
        ids = list(self._prefix)
        for message in messages:
            role = message["role"]
            if role not in self._role_ids:
                raise ValueError(
                    f"unknown chat role {role!r}; expected one of {list(self._role_ids)}"
                )
            if not message.get("content"):
                continue
            ids.append(self._role_ids[role])
            ids += self.encode(f"{message.get('metadata', '')}\n{message['content']}")
        if add_generation_prompt:
            ids.append(self._role_ids["assistant"])
        return ids

    def _thinking_template(
        self, messages: list[dict], add_generation_prompt: bool, enable_thinking: bool, tools: list[dict]
    ) -> list[int]:
        """GLM-4.5/4.7's template.

        Unlike GLM-4's, empty messages are kept. An assistant turn keeps its reasoning (its
        ``reasoning_content``, or the ``<think>...</think>`` part of its content) only after the
        last user turn; earlier turns lose it. Text stays text: a ``<think>`` or ``/nothink``
        inside a message is never the control token.
        """
        layout = THINKING_LAYOUTS[self.layout]
        roles = {"system": Special("<|system|>"), "user": Special("<|user|>"),
                 "assistant": Special("<|assistant|>")}
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        nothink = Special(NO_THINK) if self.tokenizer.token_to_id(NO_THINK) is not None else NO_THINK
        pieces: list[str] = [roles["system"], *tool_prompt.tools_turn(self.layout, tools)] if tools else []
        for index, message in enumerate(messages):
            role = message["role"]
            if role not in THINKING_ROLES:
                raise ValueError(f"unknown chat role {role!r}; expected one of {list(THINKING_ROLES)}")
            content = visible_text(message.get("content"))
            if role == "tool":
                first = index == 0 or messages[index - 1]["role"] != "tool"
                pieces += tool_prompt.response_pieces(self.layout, content, first)
                continue
            if role != "assistant":
                pieces += [roles[role], layout.newline, content]
                if role == "user" and layout.user_nothink and not enable_thinking \
                        and not content.endswith(NO_THINK):
                    pieces.append(nothink)
                continue
            reasoning = message.get("reasoning_content")
            if not isinstance(reasoning, str):
                reasoning = ""
                if THINK_CLOSE in content:
                    reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
                    content = content.split(THINK_CLOSE)[-1].lstrip("\n")
            pieces.append(roles["assistant"])
            if index > last_user and reasoning:
                pieces += [layout.newline, _OPEN, reasoning.strip(), _CLOSE]
            else:
                pieces += layout.empty_think
            if content.strip():
                pieces += [layout.newline, content.strip()]
            pieces += tool_prompt.call_pieces(self.layout, message.get("tool_calls"))
        if add_generation_prompt:
            pieces.append(roles["assistant"])
            pieces += layout.prompt_thinking if enable_thinking else layout.prompt_not_thinking
        return self._prefix + self._encode_pieces(pieces)

    def _encode_pieces(self, pieces: list[str]) -> list[int]:
        """Special pieces by id; the text between two of them encoded as one string, as a
        tokenizer splits a rendered prompt at its added tokens before encoding the rest."""
        ids: list[int] = []
        text: list[str] = []
        for piece in self._split_markup(pieces):
            if isinstance(piece, Special):
                if "".join(text):
                    ids += self.encode("".join(text))
                text = []
                ids.append(self._special_id(piece))
            else:
                text.append(piece)
        if "".join(text):
            ids += self.encode("".join(text))
        return ids

    def _split_markup(self, pieces: list[str]) -> list[str]:
        """The template's own text (``Markup``) split at the added tokens it holds."""
        out: list[str] = []
        for piece in pieces:
            if not isinstance(piece, Markup) or self._added is None:
                out.append(piece)
                continue
            start = 0
            for found in self._added.finditer(piece):
                out += [str(piece[start:found.start()]), Special(found.group())]
                start = found.end()
            out.append(str(piece[start:]))
        return out

    def encode_reply(self, pieces: list[str]) -> list[int]:
        """Ids of text the model writes, laid out in pieces as ``inference.tool_prompt`` gives them."""
        return self._encode_pieces(pieces)

    def detokenizer(self, skip_special_tokens: bool = True) -> "IncrementalDetokenizer":
        if skip_special_tokens and self._skipped_ids is not None:
            return IncrementalDetokenizer(self.tokenizer, False, self._skipped_ids)
        return IncrementalDetokenizer(self.tokenizer, skip_special_tokens)

    def _special_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer lacks the GLM special token {token!r}")
        return token_id


class IncrementalDetokenizer:
    """Streams text as tokens arrive, never emitting half a character.

    Byte-level BPE splits one Chinese character or emoji over several tokens, so a
    token alone may decode to U+FFFD. As in vLLM, only a short window is decoded per
    token: the text from ``prefix`` to ``read`` was emitted already, the rest is new.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True,
                 skipped_ids: set[int] | None = None):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.skipped_ids = skipped_ids  # left out of the text (the tokenizer's own flags aside)
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Whatever is still held back, even if it ends in an incomplete character."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        seen = self._decode(self.ids[self.prefix : self.read])
        text = self._decode(self.ids[self.prefix :])
        if len(text) <= len(seen) or (text.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(seen) :]

    def _decode(self, ids: list[int]) -> str:
        if self.skipped_ids:
            ids = [i for i in ids if i not in self.skipped_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)


class StopStringMatcher:
    """Cuts a text stream at the first stop string, even one split across tokens.

    Holds back any tail that could still grow into a stop string, so nothing past
    the stop is ever sent to the user.
    """

    def __init__(self, stop: list[str]):
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.stop = list(stop)
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit now, whether a stop string was hit)."""
        if self.stopped:
            return "", True
        text = self.held + text
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.held, self.stopped = "", True
            return text[: min(hits)], True
        keep = self._partial_stop_length(text)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held

    def _partial_stop_length(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest


def build_glm_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE with the GLM special tokens at ids 0..9.

    Byte-level means any text encodes, Chinese and emoji included, with no unknown
    token; NFC first so the same character typed two ways gets the same ids.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(GLM_SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must cover 256 bytes + special tokens, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in GLM_SPECIAL_TOKENS],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def save_glm_tokenizer(
    tokenizer: Tokenizer, model_dir: str | Path, eos: Iterable[str] = GLM_EOS_TOKENS
) -> None:
    """Write the files ``ChatTokenizer.from_pretrained`` (and HF) read.

    generation_config.json is left alone if present: the model's own config wins.
    """
    model_dir, eos = Path(model_dir), list(eos)
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(model_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": GLM_SPECIAL_TOKENS[1:],
        "chat_template": GLM_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    write_json(model_dir / "tokenizer_config.json", config)
    generation = model_dir / "generation_config.json"
    if not generation.exists():
        eos_ids = [tokenizer.token_to_id(t) for t in eos]
        if None in eos_ids:
            raise ValueError(f"eos tokens {eos} are not all in the vocabulary")
        pad = tokenizer.token_to_id("<|endoftext|>")
        write_json(generation, {"eos_token_id": eos_ids, "pad_token_id": pad})


def visible_text(content) -> str:
    """A message's text: a string, or the text parts of OpenAI's list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        part if isinstance(part, str) else part.get("text", "")
        for part in content
        if isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")
    )


def chat_template_of(model_dir: Path, config: dict) -> str | None:
    """The checkpoint's own Jinja chat template: ``chat_template.jinja``, else the (default)
    template in tokenizer_config.json."""
    path = model_dir / "chat_template.jinja"
    if path.exists():
        return path.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def token_content(token: str | dict) -> str:
    """tokenizer_config.json spells a token as a string or as an AddedToken dict."""
    return token["content"] if isinstance(token, dict) else token


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
