"""Blocks -> chunks: the passages retrieval ranks and the prompt quotes.

A chunk never spans two sections, so its heading path ("3. HR 人力资源 › Leave") is what the
answer cites. Within a section, paragraphs (a list item is one) are packed in order while the
chunk stays within ``max_tokens``; a paragraph longer than that is cut at sentence ends, a
sentence longer than that at ``max_tokens``. A cut keeps the paragraph's lines, and each piece
after the first opens with the paragraph's lead: a table's header row, or a first line that
introduces what follows ("- **Hotel limits per night**:"), so that "Outside mainland China:
1,500 RMB" still says what it is a limit of. Sizes are in ``terms.count_tokens`` tokens (one
Chinese character or one English word), which keeps a chunk's share of the model's context
predictable for both languages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.knowledge.parsing import Block
from app.knowledge.terms import SIZE_TOKEN, count_tokens

DEFAULT_MAX_TOKENS = 200
SENTENCE_END = re.compile(r"(?<=[。！？!?；;])\s*|(?<=[.])\s+")
FULL_WIDTH_STOPS = "。！？；：，"
ITEM_START = re.compile(r"\s*(?:[-*+]\s|\d+[.)]\s|\|)")  # a list item or a table row opens a line
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


TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}")
LEAD_END = re.compile(r"[:：]\s*(?:\*\*|__)?\s*$")
MAX_LEAD_SHARE = 0.4  # a lead longer than this share of a chunk is not repeated


def _lead(lines: list[str], max_tokens: int) -> str:
    """What each later piece of a cut paragraph repeats: a table's header row and rule, or a
    first line ending in a colon with more lines under it; "" when there is none or it is long."""
    if len(lines) > 2 and lines[0].lstrip().startswith("|") and TABLE_RULE.match(lines[1]):
        lead = "\n".join(lines[:2])
    elif len(lines) > 1 and LEAD_END.search(lines[0]):
        lead = lines[0]
    else:
        return ""
    return lead if count_tokens(lead) <= max_tokens * MAX_LEAD_SHARE else ""


def _lines(paragraph: str) -> list[str]:
    """A paragraph's lines as written: each list item or table row with the lines wrapped under
    it (Markdown's soft wraps: "须在 **24 小时**内" goes on with "报告 IT"), blank lines dropped."""
    lines: list[str] = []
    for raw in paragraph.split("\n"):
        if not raw.strip():
            continue
        if lines and not ITEM_START.match(raw) and not lines[-1].lstrip().startswith("|"):
            lines[-1] += "\n" + raw.rstrip()
        else:
            lines.append(raw.rstrip())
    return lines


def _units(line: str, max_tokens: int) -> list[str]:
    """A line in sentences, and a sentence longer than ``max_tokens`` cut by tokens."""
    if count_tokens(line) <= max_tokens:
        return [line]
    units = []
    for sentence in filter(None, (s.strip() for s in SENTENCE_END.split(line))):
        while count_tokens(sentence) > max_tokens:
            cut = list(SIZE_TOKEN.finditer(sentence))[max_tokens - 1].end()
            units.append(sentence[:cut])
            sentence = sentence[cut:].strip()
        if sentence:
            units.append(sentence)
    if units:
        units[0] = line[: len(line) - len(line.lstrip())] + units[0]  # the item's indent
    return units


def _pieces(paragraph: str, max_tokens: int) -> list[str]:
    """A paragraph in pieces of at most ``max_tokens``, cut between lines, else at sentence ends,
    else by tokens; each piece after the first opens with the paragraph's lead (``_lead``)."""
    if count_tokens(paragraph) <= max_tokens:
        return [paragraph]
    lines = _lines(paragraph)
    lead = _lead(lines, max_tokens)
    pieces: list[str] = []
    current, size = "", 0
    body = lines[2:] if lead and lead.count("\n") else lines[1:] if lead else lines
    if lead:
        current, size = lead, count_tokens(lead)
    for line in body:
        room = max_tokens - count_tokens(lead) if lead else max_tokens
        for number, unit in enumerate(_units(line, room)):
            unit_size = count_tokens(unit)
            if current and current != lead and size + unit_size > max_tokens:
                pieces.append(current)
                current, size = (lead, count_tokens(lead)) if lead else ("", 0)
            if not current:
                current = unit
            elif number == 0 or current == lead:
                current = f"{current}\n{unit}"
            else:  # a line's next sentence: after a space, none after Chinese punctuation
                current += ("" if current[-1] in FULL_WIDTH_STOPS else " ") + unit
            size += unit_size
    if current and current != lead:
        pieces.append(current)
    return pieces


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
