"""Text in, token ids out, and back again: the GLM-4 chat format and streaming decode.

Built on HF ``tokenizers`` alone so the engine never imports ``transformers``.
"""

import json
from collections.abc import Iterable
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


class ChatTokenizer:
    """A trained tokenizer plus the GLM-4 chat layout and the ids that end a reply.

    Takes ownership of ``tokenizer``: it is switched to treat all text as plain text.
    """

    def __init__(self, tokenizer: Tokenizer, eos_token_ids: list[int]):
        # Text is always plain text: a literal "<|assistant|>" typed by a user must not
        # become the role token. Special tokens enter only by id, in apply_chat_template.
        tokenizer.encode_special_tokens = True
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._prefix = [self._special_id("[gMASK]"), self._special_id("<sop>")]
        self._role_ids = {
            role: self._special_id(f"<|{role}|>")
            for role in CHAT_ROLES
            if tokenizer.token_to_id(f"<|{role}|>") is not None
        }

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
        return cls(tokenizer, [eos] if isinstance(eos, int) else list(eos))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True
    ) -> list[int]:
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

    def detokenizer(self, skip_special_tokens: bool = True) -> "IncrementalDetokenizer":
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

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
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


def token_content(token: str | dict) -> str:
    """tokenizer_config.json spells a token as a string or as an AddedToken dict."""
    return token["content"] if isinstance(token, dict) else token


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
