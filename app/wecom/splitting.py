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

With ``markup`` (a ``markdown`` message, the AI bot's stream) a cut never falls inside a span of
WeCom's markdown (``**bold**``, ``inline code``, ``[link](url)``, ``<font color>``): a separator
inside one is skipped, and a forced cut moves to before the span; a span longer than a whole
chunk is closed at the cut and opened again in the next chunk (a link cannot be, and is cut).
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
# WeCom markdown spans a cut must not break: (pattern, its opening mark's group or text, closer).
_SPANS = (
    (re.compile(r"\*\*(?=\S)[^\n]+?(?<=\S)\*\*"), "**", "**"),
    (re.compile(r"`[^`\n]+`"), "`", "`"),
    (re.compile(r"(<font\s+color=[\"']?\w+[\"']?\s*>).*?</font>", re.S | re.I), None, "</font>"),
    (re.compile(r"!?\[[^\]\n]*\]\([^)\s]*\)"), "", ""),
)
_CLOSER_RESERVE = 8  # bytes kept free in a chunk for a closing mark ("</font>")


def _markup_spans(text: str) -> list[tuple[int, int, str, str]]:
    """(start, end, opener, closer) of each markdown span, in order, none overlapping."""
    found = []
    for pattern, opener, closer in _SPANS:
        for m in pattern.finditer(text):
            found.append((m.start(), m.end(), m.group(1) if opener is None else opener, closer))
    spans, last_end = [], -1
    for span in sorted(found):
        if span[0] >= last_end:
            spans.append(span)
            last_end = span[1]
    return spans


def split_for_wecom(text: str, limit_bytes: int, markup: bool = False) -> list[str]:
    """Chunks of ``text``, each at most ``limit_bytes`` in UTF-8, in order; [] for blank input.
    ``markup``: keep WeCom markdown's spans whole (the module's docstring)."""
    if limit_bytes < 4 or (markup and limit_bytes < 64):
        raise ValueError("limit_bytes must hold at least one UTF-8 character (4 bytes; 64 with markup)")
    spans = _markup_spans(text) if markup else []

    def containing(index: int):
        return next((s for s in spans if s[0] < index < s[1]), None)

    def whole(span) -> bool:  # the span fits in a chunk of its own: never cut inside it
        return len(text[span[0]:span[1]].encode("utf-8")) <= limit_bytes - 2 * _CLOSER_RESERVE

    def blocked(cut: int) -> bool:
        span = containing(cut)
        return span is not None and whole(span)

    chunks: list[str] = []
    pos, end, carry = 0, len(text), ""
    while True:
        while pos < end and (text[pos] in "\r\n" or (carry and text[pos] in " \t")):
            pos += 1
        budget = limit_bytes - len(carry.encode("utf-8"))
        # More characters than bytes allowed means more bytes too (a character is >= 1 byte).
        if end - pos <= budget and len(text[pos:].encode("utf-8")) <= budget:
            break
        if spans:
            budget -= _CLOSER_RESERVE
        window = _fitting_prefix(text[pos:pos + budget], budget)
        cut, resume = _best_cut(window, (lambda c, at=pos: blocked(at + c)) if spans else None)
        if cut == 0:
            cut = resume = _grapheme_safe_cut(text, pos, pos + len(window)) - pos
        closer = opener = ""
        span = containing(pos + cut)
        if span is not None and span[0] > pos and whole(span):
            cut = resume = span[0] - pos  # the span goes whole into the next chunk
        elif span is not None:  # longer than a chunk: closed here, opened again there
            closer, opener = span[3], span[2]
        chunks.append(carry + text[pos:pos + cut].rstrip() + closer)
        carry = opener
        pos += resume
    chunks.append(carry + text[pos:].rstrip())
    return [chunk for chunk in chunks if chunk.strip()]


def _fitting_prefix(text: str, limit_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding fits ``limit_bytes``."""
    # Cutting the bytes may split the last character, which "ignore" then drops whole.
    return text.encode("utf-8")[:limit_bytes].decode("utf-8", "ignore")


def _best_cut(window: str, blocked=None) -> tuple[int, int]:
    """(end of chunk, start of the rest) at the best separator in ``window``; (0, 0) if none.
    ``blocked(cut)``: a cut there is not taken (inside a markdown span)."""
    min_cut = int(len(window) * _MIN_FILL)
    fallback = (0, 0)
    for pattern in _SEPARATORS:
        best = None
        for match in pattern.finditer(window):
            kept = next((group for group in match.groups() if group), "")
            cut = match.start() + len(kept)
            if cut > 0 and not (blocked and blocked(cut)):
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
