"""Who reads an answer decides the documents it may use: each reader must be allowed to see a
document (``app.knowledge.audience``), applied in retrieval's SQL on both databases."""

from __future__ import annotations

import pytest

from app.knowledge.audience import Audience
from app.knowledge.retrieval import Retriever
from app.knowledge.store import KnowledgeStore

R_AND_D, PRODUCT, FINANCE = 2, 4, 7
DOCS = {  # title -> visible to (None: everyone)
    "公开 Public": None,
    "研发与产品 R&D and Product": [R_AND_D, PRODUCT],
    "财务 Finance": [FINANCE],
}


def test_a_reader_adds_nothing_when_another_needs_less():
    audience = Audience.of([[R_AND_D, FINANCE], [R_AND_D], [R_AND_D, PRODUCT], [PRODUCT]])
    assert set(audience.requirements()) == {frozenset({R_AND_D}), frozenset({PRODUCT})}
    assert Audience.of([]).public_only and Audience.company_wide().public_only
    assert Audience.of([[FINANCE], []]).public_only  # one member in no department


def test_ids_that_are_not_department_ids_are_dropped():
    audience = Audience.of([[FINANCE, 10**30, -1, 0], ["7", True]])
    assert audience.readers == (frozenset({FINANCE}), frozenset({FINANCE}))


@pytest.mark.parametrize(("readers", "titles"), [
    ([[FINANCE]], {"公开 Public", "财务 Finance"}),
    ([[FINANCE], [R_AND_D]], {"公开 Public"}),
    ([[R_AND_D], [PRODUCT]], {"公开 Public", "研发与产品 R&D and Product"}),  # each may see it
    ([[R_AND_D, FINANCE], [FINANCE]], {"公开 Public", "财务 Finance"}),
    ([[R_AND_D, FINANCE], [PRODUCT]], {"公开 Public", "研发与产品 R&D and Product"}),
    ([[R_AND_D], []], {"公开 Public"}),
    ([], {"公开 Public"}),
])
def test_a_document_is_found_only_when_every_reader_may_see_it(services, readers, titles):
    store = KnowledgeStore(services)
    for title, departments in DOCS.items():
        store.add(f"# {title}\n\n## 制度 Rules\n\n共同的规定 shared rule text {title}\n".encode(), title,
                  departments=departments)
    audience = Audience.of(readers)
    found = Retriever(services).search("共同的规定 shared rule", audience, min_score=0).candidates
    assert {p.title for p in found} == titles
    assert all(audience.may_see("departments" if DOCS[t] else "all", DOCS[t] or []) for t in titles)
