"""Training corpus for the bundled demo model (fictional company Xinghe Technology).

Facts live in ``company.md``; ``qa.jsonl`` holds question/answer items with paraphrases
and held-out paraphrases (for evaluation only); ``dialogues.jsonl`` holds short
multi-turn exchanges. See ``README.md``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parent
QA_PATH = CORPUS_DIR / "qa.jsonl"
DIALOGUES_PATH = CORPUS_DIR / "dialogues.jsonl"
COMPANY_PATH = CORPUS_DIR / "company.md"
COMPANY_ZH_PATH = CORPUS_DIR / "company.zh.md"
# Handbook editions for the demo knowledge base, as (path, title); company.md is the source of truth.
HANDBOOKS = (
    (COMPANY_PATH, "星河科技员工手册 Employee Handbook"),
    (COMPANY_ZH_PATH, "星河科技员工手册（中文版）"),
)
UNANSWERABLE_PATH = CORPUS_DIR / "unanswerable.jsonl"
EMBEDDER_QUESTIONS_PATH = CORPUS_DIR / "embedder_questions.jsonl"

TOPICS = ("it", "hr", "expense", "travel", "security", "office", "bot", "greeting", "smalltalk")
LANGS = ("zh", "en")


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path.name}:{lineno}: invalid JSON: {e}") from e
    return rows


@lru_cache(maxsize=1)
def _qa() -> tuple[dict, ...]:
    return tuple(_read_jsonl(QA_PATH))


def load_qa() -> list[dict]:
    """All Q&A items, in file order (fresh copies; safe to mutate)."""
    return [json.loads(json.dumps(item)) for item in _qa()]


def load_dialogues() -> list[dict]:
    """Multi-turn dialogues: ``{"id", "messages": [{"role", "content"}, ...]}``."""
    return _read_jsonl(DIALOGUES_PATH)


def load_unanswerable() -> list[dict]:
    """Questions the handbook does not answer: ``{"question", "lang", "near"}``.

    ``near`` names the handbook section the question sounds close to, or ``"none"``
    for off-topic questions. Used to teach the model to decline.
    """
    return _read_jsonl(UNANSWERABLE_PATH)


def load_embedder_questions() -> list[dict]:
    """More questions for the embedder alone: ``{"question", "lang", "answers": qa id}`` (another
    wording of that item's question) or ``{"question", "lang", "near"}`` (one the handbook does
    not answer, as in ``unanswerable.jsonl``).

    Why apart from ``qa.jsonl``: the embedder learns a question's words only from wordings it
    has seen and trains in about fifteen minutes; the demo model's training, bounded at 45
    minutes, stays on ``qa.jsonl``.
    """
    return _read_jsonl(EMBEDDER_QUESTIONS_PATH)


def training_pairs() -> list[tuple[str, str]]:
    """(question, answer) for each item's question and paraphrases; held-out excluded."""
    pairs = []
    for item in _qa():
        for q in [item["question"], *item["paraphrases"]]:
            pairs.append((q, item["answer"]))
    return pairs


def heldout_pairs() -> list[tuple[str, str]]:
    """(held-out paraphrase, answer) pairs, for evaluation only; never train on these."""
    return [(q, item["answer"]) for item in _qa() for q in item["heldout"]]
