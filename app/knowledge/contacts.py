"""Who owns a topic: the team a "not found" names.

A decline that sends every HR and finance question to the IT help desk sends employees to the
wrong door, so the team comes from the documents themselves, worked out when a document is
indexed and kept sealed with it (``kb_documents.contacts_enc``):

1. a line in a section that names its contact ("Contact: ...", "联系人：...", "联系方式：...")
   owns that section and the sections under it;
2. the document's contacts table (a table under a heading that says "contacts" or "联系"), each
   row a team and how to reach it: a top-level section whose heading shares a word with a team's
   name ("3. HR 人力资源" and "HR 人力资源") is that team's; otherwise the team whose extension or
   e-mail the section gives most often ("4. Expenses" writes "ext. 8300": Finance);
3. the contact the admin gave the document (``kb add --contact``, the upload form) owns the rest;
4. ``KB_FALLBACK_CONTACT`` when none of these says.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from app.knowledge.chunking import PATH_SEPARATOR, Chunk
from app.knowledge.parsing import Block

MAX_CONTACT_CHARS = 200
CONTACT_HEADING = re.compile(r"contact|联系|通讯录", re.I)
CONTACT_LINE = re.compile(
    r"^\s*(?:[-*+]\s*)?(?:\*\*|__)?(?:contacts?|owner|联系人|联系方式|负责团队|负责人)(?:\*\*|__)?\s*[:：]\s*"
    r"(?:\*\*|__)?\s*(?P<who>\S.*?)\s*$", re.I | re.M)
MARKUP = re.compile(r"\*\*|__|`|\[|\]\([^)]*\)")
REACH = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+|\b\d{3,}\b")
LATIN_WORD = re.compile(r"[a-z]{2,}")
CJK_RUN = re.compile(r"[\u4e00-\u9fff]{2,}")
# words a team's name and a heading may share without meaning the same team
COMMON_WORDS = frozenset({"the", "and", "of", "to", "in", "for", "at", "on", "desk", "center", "centre",
                          "team", "part", "life", "help", "office", "general"})


@dataclass(frozen=True)
class Team:
    """A row of a contacts table: the team's name and how to reach it."""

    name: str
    reach: str

    @property
    def line(self) -> str:
        return f"{self.name} ({self.reach})" if self.reach else self.name

    @property
    def handles(self) -> tuple[str, ...]:
        """The extensions and e-mail addresses a section may give to point to this team."""
        return tuple(dict.fromkeys(REACH.findall(self.reach)))


def plain(text: str) -> str:
    return re.sub(r"\s+", " ", MARKUP.sub("", text)).strip()


def _cells(row: str) -> list[str]:
    return [plain(cell) for cell in row.strip().strip("|").split("|")]


def teams_of(blocks: Iterable[Block]) -> list[Team]:
    """The rows of every table under a contacts heading (the parsed blocks keep a table's rows
    apart; a chunk may run them together): a team's name in the first cell, and from the other
    cells those that give a number or an e-mail address. The header row gives neither."""
    teams: list[Team] = []
    heading = ""
    for block in blocks:
        if block.level:
            heading = block.text
            continue
        if not CONTACT_HEADING.search(heading) or not block.text.lstrip().startswith("|"):
            continue
        for line in block.text.splitlines():
            if re.fullmatch(r"[\s|:-]+", line):
                continue
            cells = _cells(line)
            name, rest = cells[0], [c for c in cells[1:] if REACH.search(c)]
            if name and rest and not any(t.name == name for t in teams):
                teams.append(Team(name, ", ".join(rest)[:MAX_CONTACT_CHARS]))
    return teams


def _words(text: str) -> set[str]:
    lowered = text.lower()
    words = {w for w in LATIN_WORD.findall(lowered) if w not in COMMON_WORDS}
    for run in CJK_RUN.findall(text):
        words.update(run[i:i + 2] for i in range(len(run) - 1))
    return words


def _owner_by_name(heading: str, teams: list[Team]) -> Team | None:
    words = _words(heading)
    named = [t for t in teams if words & _words(t.name)]
    return named[0] if len(named) == 1 else None


def _owner_by_reach(text: str, teams: list[Team]) -> Team | None:
    counts = Counter()
    for team in teams:
        for handle in team.handles:
            counts[team] += len(re.findall(rf"(?<![\w.@-]){re.escape(handle)}(?![\w-])", text))
    ranked = counts.most_common(2)
    if not ranked or ranked[0][1] == 0 or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    return ranked[0][0]


def section_contacts(blocks: list[Block], chunks: list[Chunk]) -> dict[str, str]:
    """Section path (as the chunks cite it) -> the contact that owns it (rules 1 and 2 above),
    for the sections that have one; a section not listed takes its nearest listed ancestor's
    (``owner``)."""
    teams = teams_of(blocks)
    owners: dict[str, str] = {}
    top_text: dict[str, list[str]] = {}
    for chunk in chunks:
        if chunk.headings:
            top_text.setdefault(chunk.headings[0], []).append(chunk.text)
    for top, texts in top_text.items():
        if CONTACT_HEADING.search(top):
            continue  # the contacts table's own section names every team
        team = _owner_by_name(top, teams) or _owner_by_reach("\n".join(texts), teams)
        if team is not None:
            owners[top] = team.line
    for chunk in chunks:  # a section's own contact line wins over the table
        found = CONTACT_LINE.search(chunk.text)
        if found and chunk.headings:
            owners[chunk.section] = plain(found.group("who"))[:MAX_CONTACT_CHARS]
    return owners


def owner(contacts: dict, section: str) -> str | None:
    """The contact of ``section`` (a passage's heading path): its own, its nearest ancestor's,
    or the document's; None when the document says nothing."""
    sections = contacts.get("sections") or {}
    parts = section.split(PATH_SEPARATOR) if section else []
    for end in range(len(parts), 0, -1):
        found = sections.get(PATH_SEPARATOR.join(parts[:end]))
        if found:
            return found
    return contacts.get("document") or None


def document_contact(text: str | None) -> str:
    """An admin's contact for a whole document, checked: one line, not too long."""
    text = plain(text or "")
    if len(text) > MAX_CONTACT_CHARS:
        raise ValueError(f"the contact is longer than {MAX_CONTACT_CHARS} characters")
    return text


def dumps(sections: dict[str, str], document: str) -> str:
    return json.dumps({"sections": sections, "document": document}, ensure_ascii=False, sort_keys=True)


def loads(sealed_plaintext: str | None) -> dict:
    if not sealed_plaintext:
        return {}
    try:
        value = json.loads(sealed_plaintext)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
