"""Blocks -> chunks: the passages retrieval ranks and the prompt quotes.

A chunk never spans two sections, so its heading path ("3. HR 人力资源 › Leave") is what the
answer cites. Within a section, paragraphs (a list item is one) are packed in order while the
chunk stays within ``max_tokens``; a paragraph longer than that is cut at sentence ends, a
sentence longer than that at ``max_tokens``. A markdown table longer than that is cut between
rows, and every piece starts with the table's header row (and its ``|---|`` line): a row read
alone ("| Travel desk | **8350** |") says what its cells are only under its header ("| Team |
Extension |"), for the ranking and for the model reading the passage. Sizes are in ``terms.count_tokens`` tokens (one
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
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
PATH_SEPARATOR = " › "


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


def _table_pieces(table: str, max_tokens: int) -> list[str] | None:
    """A markdown table in pieces of whole rows, each under the header row and its rule line;
    None when ``table`` is not one (a header, a rule line, rows) or its header alone is too big."""
    lines = [line.rstrip() for line in table.split("\n") if line.strip()]
    if len(lines) < 3 or not all(line.lstrip().startswith("|") for line in lines) \
            or not TABLE_RULE.match(lines[1]):
        return None
    head = "\n".join(lines[:2])
    budget = max_tokens - count_tokens(head)
    if budget < max_tokens // 4:
        return None
    pieces: list[str] = []
    rows: list[str] = []
    for row in lines[2:]:
        if rows and count_tokens("\n".join([*rows, row])) > budget:
            pieces.append("\n".join([head, *rows]))
            rows = []
        rows.append(row)
    if rows:
        pieces.append("\n".join([head, *rows]))
    # a row longer than the budget alone: cut like any long paragraph
    return [p for piece in pieces for p in _sentence_pieces(piece, max_tokens)]


def _pieces(paragraph: str, max_tokens: int, table_headers: bool = True) -> list[str]:
    """A paragraph in pieces of at most ``max_tokens``, cut at sentence ends when it can be (a
    table between rows, under its header: ``_table_pieces``, unless not ``table_headers``)."""
    if count_tokens(paragraph) <= max_tokens:
        return [paragraph]
    table = _table_pieces(paragraph, max_tokens) if table_headers else None
    return table if table is not None else _sentence_pieces(paragraph, max_tokens)


def _sentence_pieces(paragraph: str, max_tokens: int) -> list[str]:
    if count_tokens(paragraph) <= max_tokens:
        return [paragraph]
    pieces: list[str] = []
    current = ""
    for sentence in filter(None, (s.strip() for s in SENTENCE_END.split(paragraph))):
        while count_tokens(sentence) > max_tokens:  # one sentence too long: cut by tokens
            spans = list(SIZE_TOKEN.finditer(sentence))
            cut = spans[max_tokens - 1].end()
            head, sentence = sentence[:cut], sentence[cut:].strip()
            if current:
                pieces.append(current)
                current = ""
            pieces.append(head)
        joined = f"{current} {sentence}".strip() if current else sentence
        if current and count_tokens(joined) > max_tokens:
            pieces.append(current)
            current = sentence
        else:
            current = joined
    if current:
        pieces.append(current)
    return pieces


def chunk_blocks(blocks: list[Block], max_tokens: int = DEFAULT_MAX_TOKENS,
                 table_headers: bool = True) -> list[Chunk]:
    """``table_headers`` False: a long table is cut like any paragraph (its rows without the
    header: what a model trained on such passages, the bundled demo's, knows)."""
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
        for piece in _pieces(block.text, max_tokens, table_headers):
            size = count_tokens(piece)
            if current and current_tokens + size > max_tokens:
                flush()
            current.append(piece)
            current_tokens += size
    flush()
    return chunks
