"""Blocks -> chunks: the passages retrieval ranks and the prompt quotes.

A chunk never spans two sections, so its heading path ("3. HR 人力资源 › Leave") is what the
answer cites. Within a section, paragraphs (a list item is one) are packed in order while the
chunk stays within ``max_tokens``; a paragraph longer than that is cut at sentence ends, a
sentence longer than that at ``max_tokens``. A later piece of a cut paragraph repeats what it
belongs to, so that it reads (and is found) on its own: a list item's bold label ("- **密码**
（域账号）：" before "连续输错 5 次后账号锁定") or a table's header row. Sizes are in ``terms.count_tokens`` tokens (one
Chinese character or one English word), which keeps a chunk's share of the model's context
predictable for both languages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.knowledge.parsing import Block
from app.knowledge.terms import SIZE_TOKEN, count_tokens

DEFAULT_MAX_TOKENS = 200
SENTENCE_END = re.compile(r"(?<=[。！？!?；;])|(?<=[.])\s+|\n")
PATH_SEPARATOR = " › "
# a list item's bold label, up to its colon: "- **Passwords** (domain account):"
LIST_LABEL = re.compile(r"^\s*((?:[-*+]|\d+[.)])\s+\*\*[^*\n]+\*\*)(?:[^\n:：]|\n(?!\s*[-*+|]))"
                        r"{0,80}[:：]")
# a line break inside a sentence (Markdown's wrapped lines): not a place to cut
SOFT_WRAP = re.compile(r"(?<![。！？!?；;.:：])\n[ \t]*(?!\s*(?:[-*+|]|\d+[.)])\s)")
TABLE_HEAD = re.compile(r"^\|[^\n]*\|\n\|[\s:|-]+\|(?=\n)")  # a header row and its rule


@dataclass(frozen=True)
class Chunk:
    ordinal: int
    headings: tuple[str, ...]
    text: str
    tokens: int

    @property
    def section(self) -> str:
        return PATH_SEPARATOR.join(self.headings)

    @property
    def indexed_text(self) -> str:
        """What is indexed: the heading path counts as part of the passage ("VPN" in a heading
        makes every passage under it a VPN passage)."""
        return f"{self.section}\n{self.text}" if self.headings else self.text


def _unwrap(wrap: re.Match) -> str:
    """A wrapped line joins with a space, or with nothing after Chinese text (which has none)."""
    before = wrap.string[wrap.start() - 1] if wrap.start() else ""
    return "" if re.match(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]", before) else " "


def _lead(paragraph: str, max_tokens: int) -> str:
    """What a later piece of this paragraph repeats: a table's header row (one with words, in at
    most half a piece), or a list item's label (in at most a third; the bold words alone when
    its remark is longer)."""
    table = TABLE_HEAD.match(paragraph)
    if table:
        head = " ".join(table.group(0).split())
        has_words = re.search(r"\w", head.replace("-", ""))
        return head if has_words and count_tokens(head) <= max_tokens // 2 else ""
    label = LIST_LABEL.match(paragraph)
    if not label:
        return ""
    for lead in (" ".join(label.group(0).split()), f"{label.group(1)}{label.group(0)[-1]}"):
        if count_tokens(lead) <= max_tokens // 3:
            return lead
    return ""


def _pieces(paragraph: str, max_tokens: int) -> list[str]:
    """A paragraph in pieces of at most ``max_tokens``, cut at sentence ends when it can be; each
    piece after the first starts with the paragraph's ``_lead``."""
    if count_tokens(paragraph) <= max_tokens:
        return [paragraph]
    lead = _lead(paragraph, max_tokens)
    pieces: list[str] = []
    current = ""

    def room() -> int:  # a later piece keeps space for the lead
        return max_tokens - count_tokens(lead) if pieces else max_tokens

    unwrapped = SOFT_WRAP.sub(_unwrap, paragraph)
    for sentence in filter(None, (s.strip() for s in SENTENCE_END.split(unwrapped))):
        while count_tokens(sentence) > room():  # one sentence too long: cut by tokens
            spans = list(SIZE_TOKEN.finditer(sentence))
            cut = spans[room() - 1].end()
            head, sentence = sentence[:cut], sentence[cut:].strip()
            if current:
                pieces.append(current)
                current = ""
            pieces.append(head)
        joined = f"{current} {sentence}".strip() if current else sentence
        if current and count_tokens(joined) > room():
            pieces.append(current)
            current = sentence
        else:
            current = joined
    if current:
        pieces.append(current)
    return [pieces[0], *(f"{lead} {piece}" if lead else piece for piece in pieces[1:])]


def chunk_blocks(blocks: list[Block], max_tokens: int = DEFAULT_MAX_TOKENS) -> list[Chunk]:
    if max_tokens < 20:
        raise ValueError("max_tokens must be at least 20")
    # A document's one top-level heading at its start is its title, cited apart: kept out of the
    # paths so that every section is not "Handbook › ...".
    if blocks and blocks[0].level == 1 and sum(1 for b in blocks if b.level == 1) == 1:
        blocks = [Block(b.text, b.level - 1) if b.level > 1 else b for b in blocks[1:]]
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []
    current: list[str] = []
    current_tokens = 0

    def flush():
        nonlocal current_tokens
        if current:
            text = "\n".join(current)
            chunks.append(Chunk(len(chunks), tuple(h for _, h in path), text, count_tokens(text)))
        current.clear()
        current_tokens = 0

    for block in blocks:
        if block.level:
            flush()
            while path and path[-1][0] >= block.level:
                path.pop()
            path.append((block.level, block.text.strip()[:200]))
            continue
        for piece in _pieces(block.text, max_tokens):
            size = count_tokens(piece)
            if current and current_tokens + size > max_tokens:
                flush()
            current.append(piece)
            current_tokens += size
    flush()
    return chunks
