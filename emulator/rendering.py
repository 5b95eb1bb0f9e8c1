"""What WeCom shows for a message the bot sent, as the emulator reads WeCom's rendering: tests
read what an employee would read (``shown`` on every sent message of the admin API), and the
chat page (``static/chat.js``, ``renderMarkup``) draws the same, by the same rules.

- ``text``: the content as typed; a literal ``**`` shows as ``**``.
- ``markdown`` (the app's message/send): WeCom's app subset only: headings (``#`` to ``######``
  and a space), ``**bold**``, ``[text](url)``, one-line ``inline code``, ``> quote`` and
  ``<font color="info|comment|warning">``; everything else (list marks, tables, ``*italic*``,
  code fences) is shown as typed.
- ``stream`` (the AI bot's answer): common Markdown: the subset above, and lists (shown as
  bullets), ``*italic*``, fenced code blocks and ``~~strikes~~``.

It is the emulator's own reading (it plays WeCom), not the app's converter: a test that checks
the app with the app's own code could not fail.
"""

from __future__ import annotations

import re

COLORS = ("info", "comment", "warning")
INLINE = re.compile(
    r"\*\*(?=\S)(?P<bold>[^\n]+?)(?<=\S)\*\*"
    r"|`(?P<code>[^`\n]+)`"
    r"|\[(?P<label>[^\]\n]+)\]\((?P<url>[^)\s]+)\)"
    r"|<font\s+color=[\"']?(?P<color>\w+)[\"']?\s*>(?P<colored>.*?)</font>", re.S)
ITALIC = re.compile(r"(?<![*\w])\*(?=[^\s*])(?P<italic>[^*\n]+?)(?<=[^\s*])\*(?![*\w])")
STRIKE = re.compile(r"~~(?=\S)(?P<strike>[^\n]+?)(?<=\S)~~")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
QUOTE = re.compile(r"^\s*>\s?(.*)$")
BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
FENCE = re.compile(r"^\s*(```|~~~)")


def inline_text(line: str, stream: bool = False) -> str:
    """A line's visible text after WeCom's inline marks."""
    def replace(m: re.Match) -> str:
        if m.group("bold") is not None:
            return inline_text(m.group("bold"), stream)
        if m.group("code") is not None:
            return m.group("code")
        if m.group("label") is not None:
            return m.group("label")
        if m.group("color") is not None and m.group("color").lower() in COLORS:
            return inline_text(m.group("colored"), stream)
        return m.group(0)  # an unknown color: shown as typed

    text = INLINE.sub(replace, line)
    if stream:
        text = STRIKE.sub(lambda m: m.group("strike"), ITALIC.sub(lambda m: m.group("italic"), text))
    return text


def markdown_text(content: str, stream: bool = False) -> str:
    """The visible text of an app ``markdown`` message (``stream``: of an AI bot stream)."""
    lines, fenced = [], False
    for line in (content or "").replace("\r\n", "\n").split("\n"):
        if stream and FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            lines.append(line)
            continue
        if (m := HEADING.match(line)) is not None:
            line = m.group(2)
        elif (m := QUOTE.match(line)) is not None:
            line = m.group(1)
        elif stream and (m := BULLET.match(line)) is not None:
            line = f"{m.group(1)}• {m.group(2)}"
        lines.append(inline_text(line, stream))
    return "\n".join(lines)


def shown(message: dict) -> str | None:
    """What the employee reads of a sent message (None for what has no text: cards, files)."""
    content = message.get("content")
    if content is None:
        return None
    kind = message.get("msgtype")
    if kind == "markdown":
        return markdown_text(content)
    if kind == "stream" or message.get("source") in ("aibot_stream", "aibot_ws"):
        return markdown_text(content, stream=True)
    return content
