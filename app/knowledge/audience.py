"""Who will read an answer, and so which documents it may draw on.

A document is visible to everyone, or to the members of the departments it names: a reader may
see it when one of their departments is on its list. An answer is read by the asker alone in a
1:1 chat, but by every member in a group chat, so there a document is used only when *each*
member may see it (the intersection of what the members may see, not the asker's view). One
member without departments (unknown to the directory, or no lookup possible) leaves only the
documents visible to everyone, and so does a chat whose members cannot be read
(``Audience.company_wide``).

``documents_visible_to`` turns an audience into the SQL condition retrieval filters on, before
anything is ranked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import and_, or_, select

from app.models import KnowledgeDocument, KnowledgeDocumentDepartment, KnowledgeVisibility
from app.wecom.departments import known_ids


@dataclass(frozen=True)
class Audience:
    """Each reader's departments (ids already checked: ``app.wecom.departments``)."""

    readers: tuple[frozenset[int], ...]

    @classmethod
    def member(cls, departments: Iterable[int]) -> Audience:
        """One reader: the asker of a 1:1 chat."""
        return cls.of([departments])

    @classmethod
    def of(cls, readers: Iterable[Iterable[int]]) -> Audience:
        """Several readers (a group chat's members); none at all reads as company-wide."""
        found = tuple(frozenset(known_ids(r)) for r in readers)
        return cls(found or (frozenset(),))

    @classmethod
    def company_wide(cls) -> Audience:
        """Anyone at all: only the documents visible to everyone."""
        return cls((frozenset(),))

    @property
    def public_only(self) -> bool:
        return any(not r for r in self.readers)

    def requirements(self) -> tuple[frozenset[int], ...]:
        """The department sets a document's list must meet, one each, fewest first.

        A reader whose departments include another reader's adds nothing (meeting the smaller
        set meets the larger), so a group of fifty in two departments is two conditions."""
        distinct = sorted(set(self.readers), key=lambda s: (len(s), sorted(s)))
        kept: list[frozenset[int]] = []
        for s in distinct:
            if not any(k <= s for k in kept):
                kept.append(s)
        return tuple(kept)

    def may_see(self, visibility: str, departments: Iterable[int]) -> bool:
        """Whether every reader may see a document of this visibility and department list."""
        if visibility == KnowledgeVisibility.ALL:
            return True
        listed = set(departments)
        return not self.public_only and all(r & listed for r in self.readers)


def documents_visible_to(audience: Audience):
    """A SELECT of the ids of the documents every reader of ``audience`` may see."""
    allowed = KnowledgeDocument.visibility == KnowledgeVisibility.ALL
    if not audience.public_only:
        each = [KnowledgeDocument.id.in_(
            select(KnowledgeDocumentDepartment.document_id)
            .where(KnowledgeDocumentDepartment.department_id.in_(sorted(s))))
            for s in audience.requirements()]
        allowed = or_(allowed, and_(*each))
    return select(KnowledgeDocument.id).where(allowed)
