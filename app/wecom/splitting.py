"""Split a long answer into chunks that fit ``message/send``'s byte limits.

WeCom counts UTF-8 bytes: text content up to 2048, markdown up to 4096. A chunk ends, in order of
preference, at a blank line (paragraph), a line break, a sentence end (。！？； or .!?; followed by
whitespace), a space, and only as a last resort at an arbitrary character, never inside a UTF-8
sequence and, where possible, not inside a grapheme (an emoji with ZWJ, skin tone or variation
selector, a letter with combining marks, CRLF).

A separator is only taken if it leaves the chunk at least half full; otherwise the next weaker
separator is tried, and only when no separator reaches half does the strongest one anywhere in the
window win. Half-full chunks keep the number of messages low: WeCom limits an app to 30 messages a
minute per member. The whitespace at a cut is consumed (the chunks carry no leading blank lines
and no trailing whitespace); all other text is kept, in order.
"""

from __future__ import annotations

import re
import unicodedata

TEXT_LIMIT = 2048
MARKDOWN_LIMIT = 4096

# Each pattern matches a separator; its first non-empty group (if any) stays in the chunk (the
# sentence's punctuation), the rest of the match is consumed.
_SEPARATORS = (
    re.compile(r"[ \t\r]*\n(?:[ \t\r]*\n)+"),  # paragraph: one or more blank lines
    re.compile(r"[ \t\r]*\n"),  # line break
    re.compile(r"([。！？；]+)[ \t]*|([.!?;]+)[ \t]+"),  # sentence end
    re.compile(r"\s+"),  # any whitespace
)
_ZWJ = "\u200d"
_MIN_FILL = 0.5


def split_for_wecom(text: str, limit_bytes: int) -> list[str]:
    """Chunks of ``text``, each at most ``limit_bytes`` in UTF-8, in order; [] for blank input."""
    if limit_bytes < 4:
        raise ValueError("limit_bytes must hold at least one UTF-8 character (4 bytes)")
    chunks: list[str] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in "\r\n":
            pos += 1
        # More characters than bytes allowed means more bytes too (a character is >= 1 byte).
        if end - pos <= limit_bytes and len(text[pos:].encode("utf-8")) <= limit_bytes:
            break
        window = _fitting_prefix(text[pos:pos + limit_bytes], limit_bytes)
        cut, resume = _best_cut(window)
        if cut == 0:
            cut = resume = _grapheme_safe_cut(text, pos, pos + len(window)) - pos
        chunks.append(text[pos:pos + cut].rstrip())
        pos += resume
    chunks.append(text[pos:].rstrip())
    return [chunk for chunk in chunks if chunk.strip()]


def _fitting_prefix(text: str, limit_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding fits ``limit_bytes``."""
    # Cutting the bytes may split the last character, which "ignore" then drops whole.
    return text.encode("utf-8")[:limit_bytes].decode("utf-8", "ignore")


def _best_cut(window: str) -> tuple[int, int]:
    """(end of chunk, start of the rest) at the best separator in ``window``; (0, 0) if none."""
    min_cut = int(len(window) * _MIN_FILL)
    fallback = (0, 0)
    for pattern in _SEPARATORS:
        best = None
        for match in pattern.finditer(window):
            kept = next((group for group in match.groups() if group), "")
            cut = match.start() + len(kept)
            if cut > 0:
                best = (cut, match.end())
        if best is None:
            continue
        if best[0] >= min_cut:
            return best
        if fallback == (0, 0):
            fallback = best
    return fallback


def _grapheme_safe_cut(text: str, start: int, cut: int) -> int:
    """Move ``cut`` left (not down to ``start``) until it does not fall inside a grapheme;
    keep it where it is if the whole window is one grapheme (a "zalgo" run)."""
    position = cut
    while start < position < len(text) and _joins(text, position):
        position -= 1
    return position if position > start else cut


def _joins(text: str, position: int) -> bool:
    """Whether text[position - 1] and text[position] belong to one grapheme."""
    before, after = text[position - 1], text[position]
    if before == "\r" and after == "\n":
        return True
    if before == _ZWJ or after == _ZWJ:
        return True
    code = ord(after)
    if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF:  # variation selectors
        return True
    if 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F:  # skin tones, emoji tags
        return True
    return unicodedata.category(after) in ("Mn", "Me", "Mc")
