"""An answer's Markdown as a WeCom app message shows it: ``markdown`` within what WeCom renders,
or ``text`` with the markup taken out. The employee never sees a literal ``**``.

WeCom's app ``markdown`` message (message/send, ``msgtype: markdown``, 4096 bytes) renders a
small subset: headings (``#`` to ``######`` with a space), ``**bold**``, ``[links](url)``,
one-line ``inline code``, ``> quotes`` and ``<font color="info|comment|warning">``. Nothing else:
a list's ``- `` and a table's pipes are shown as typed, ``*italic*`` keeps its stars, a fenced
code block its fences. So ``for_markdown`` keeps the subset and rewrites the rest to read well as
text (list items as "• ", a table's rows as "header: cell" lines, a code block's lines as inline
code), and ``to_plain`` takes every mark out for a ``text`` message (a link as "text (url)").

``has_markup`` decides which: an answer with any markup goes as ``markdown``, one without as
``text`` (the same words; the WeChat plugin, which shows no markdown, reads it too).
"""

from __future__ import annotations

import re

FONT_COLORS = ("info", "comment", "warning")

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_ORDERED = re.compile(r"^(\s*)(\d{1,3})[.)]\s+(.*)$")
_QUOTE = re.compile(r"^\s*>\s?(.*)$")
# list items a chunk ran together on one line ("... rules). - Paternity leave ..."): a " - " right
# after a sentence's or a label's end, within a list item
_RUN_ON_ITEM = re.compile(r"(?<=[.。;；!?！？:：)）])\s+-\s+(?=\S)")
_RULE = re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$")
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![*\w])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![*\w])|(?<![_\w])_(?=\S)([^_\n]+?)(?<=\S)_(?![_\w])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_CODE = re.compile(r"`([^`\n]+)`")
_IMAGE = re.compile(r"!\[([^\]\n]*)\]\(([^)\s]+)\)")
_LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)\)")
_FONT = re.compile(r"<font\s+color=[\"']?(\w+)[\"']?\s*>(.*?)</font>", re.S | re.I)
_ANY_MARK = (_BOLD, _CODE, _LINK, _IMAGE, _FONT, _STRIKE, _ITALIC)


def has_markup(text: str) -> bool:
    """Whether ``text`` holds Markdown that a ``text`` message would show literally."""
    if any(p.search(text) for p in _ANY_MARK):
        return True
    return any(_HEADING.match(line) or _BULLET.match(line) or _QUOTE.match(line) or _FENCE.match(line)
               or _TABLE_ROW.match(line) for line in text.splitlines())


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _table(rows: list[str]) -> list[str]:
    """A Markdown table as lines that read well where tables are not drawn: each row as
    "• header: cell; header: cell"."""
    if len(rows) >= 2 and _TABLE_RULE.match(rows[1]):
        header, body = _cells(rows[0]), [r for r in rows[2:] if not _TABLE_RULE.match(r)]
    else:
        header, body = [], rows
    lines = []
    for row in body:
        cells = _cells(row)
        if header and len(header) == len(cells):
            lines.append("• " + "；".join(f"{h}：{c}" if h else c for h, c in zip(header, cells, strict=True)))
        else:
            lines.append("• " + " | ".join(cells))
    return lines or ["；".join(header)]


def _blocks(text: str, code_line, heading, quote) -> list[str]:
    """The text line by line with the block-level constructs rewritten: fenced code (each line
    through ``code_line``), tables, lists, rules, headings and quotes (``heading``/``quote``
    give what they become)."""
    out: list[str] = []
    lines = text.replace("\r\n", "\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            i += 1
            while i < len(lines) and not _FENCE.match(lines[i]):
                if lines[i].strip():
                    out.append(code_line(lines[i].rstrip()))
                i += 1
            i += 1
            continue
        if _TABLE_ROW.match(line):
            rows = []
            while i < len(lines) and _TABLE_ROW.match(lines[i]):
                rows.append(lines[i])
                i += 1
            out.extend(_table(rows))
            continue
        if _RULE.match(line):
            out.append("————")
        elif (m := _HEADING.match(line)) is not None:
            out.append(heading(m.group(1), m.group(2)))
        elif (m := _BULLET.match(line)) is not None:
            depth = len(m.group(1).expandtabs(4)) // 2
            for item in _RUN_ON_ITEM.split(m.group(2)):
                out.append("  " * depth + ("◦ " if depth else "• ") + item)
        elif (m := _ORDERED.match(line)) is not None:
            out.append("  " * (len(m.group(1).expandtabs(4)) // 2) + f"{m.group(2)}. {m.group(3)}")
        elif (m := _QUOTE.match(line)) is not None:
            out.append(quote(m.group(1)))
        else:
            out.append(line)
        i += 1
    return out


def for_markdown(text: str) -> str:
    """``text`` within WeCom's app markdown: the subset kept, the rest rewritten as text."""
    def code_line(line: str) -> str:
        stripped = line.replace("`", "'").strip()
        return f"\0`{stripped}`"  # \0: a code line, no inline rewriting

    def inline(line: str) -> str:
        line = _IMAGE.sub(lambda m: f"[{m.group(1) or '图片 image'}]({m.group(2)})", line)
        line = _BOLD.sub(lambda m: f"**{m.group(1) or m.group(2)}**", line)
        line = _STRIKE.sub(lambda m: m.group(1), line)
        line = _ITALIC.sub(lambda m: m.group(1) or m.group(2), line)
        return _FONT.sub(lambda m: m.group(0) if m.group(1).lower() in FONT_COLORS else m.group(2), line)

    lines = _blocks(text, code_line, lambda hashes, title: f"{hashes} {title}", lambda q: f"> {q}")
    return "\n".join(line[1:] if line.startswith("\0") else inline(line) for line in lines).strip()


def to_plain(text: str) -> str:
    """``text`` with every Markdown mark taken out, for a ``text`` message."""
    def inline(line: str) -> str:
        line = _FONT.sub(lambda m: m.group(2), line)
        line = _IMAGE.sub(lambda m: f"{m.group(1) or '图片'} ({m.group(2)})", line)
        line = _LINK.sub(lambda m: m.group(1) if m.group(1) == m.group(2) else f"{m.group(1)} ({m.group(2)})", line)
        line = _BOLD.sub(lambda m: m.group(1) or m.group(2), line)
        line = _STRIKE.sub(lambda m: m.group(1), line)
        line = _ITALIC.sub(lambda m: m.group(1) or m.group(2), line)
        return _CODE.sub(lambda m: m.group(1), line)

    lines = _blocks(text, lambda line: line.strip(), lambda _hashes, title: f"【{title}】", lambda q: q)
    return "\n".join(inline(line) for line in lines).strip()
