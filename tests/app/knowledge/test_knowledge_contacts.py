"""A "not found" names the team that owns the topic, from the documents' own contacts
(app/knowledge/contacts.py): a section's contact line, the document's contacts table, the
admin's contact for the document, then KB_FALLBACK_CONTACT; through the real message path, on
both databases."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from app.knowledge import contacts
from app.knowledge.chunking import chunk_blocks
from app.knowledge.parsing import UploadError, parse
from app.knowledge.prompt import not_found_reply
from app.knowledge.retrieval import Retriever
from app.knowledge.store import KnowledgeStore, topic_contact
from demo.corpus import HANDBOOKS
from tests.app.knowledge.test_knowledge_base import PromptLLM, ask, processor_with

COMPANY = """# 公司手册 Company handbook

## 1. About us

### Contacts / 联系方式

| Team | Extension | Email |
|---|---|---|
| IT help desk IT 服务台 | **8100** | it@corp.example |
| HR 人力资源 | **8000** | hr@corp.example |
| Finance 财务 | **8300** | finance@corp.example |

## 2. HR 人力资源

- Annual leave: 10 days in the first year, one more each year, at most 15.
- Sick leave needs a doctor's note after two days.

## 3. Expenses 报销

- Claims are filed in WeCom Approval within 30 days; questions to ext. 8300.
- Meals on business trips: up to 100 RMB a day.

## 4. Canteen 食堂

- Lunch is served 11:30-13:30 on the 2nd floor.
- Contact: 行政部 Admin, ext. 8200

### Menus

- The week's menu is posted on Mondays.

## 5. Parking

- Parking spaces are assigned by lottery each quarter.
"""
HR = "HR 人力资源 (8000, hr@corp.example)"
FINANCE = "Finance 财务 (8300, finance@corp.example)"
ADMIN = "行政部 Admin, ext. 8200"


def owners_of(markdown: str, chunk_tokens: int = 100) -> dict[str, str]:
    parsed = parse(markdown.encode(), "doc.md")
    return contacts.section_contacts(parsed.blocks, chunk_blocks(parsed.blocks, chunk_tokens))


# -- the rules -------------------------------------------------------------------------------------
def test_sections_are_owned_by_the_team_they_name_or_whose_extension_they_give():
    owners = owners_of(COMPANY)
    assert owners["2. HR 人力资源"] == HR  # the heading names the team
    assert owners["3. Expenses 报销"] == FINANCE  # it gives Finance's extension
    assert owners["4. Canteen 食堂"] == ADMIN  # its own contact line, though no table row names it
    assert "5. Parking" not in owners  # nothing says: the document's or the fallback contact
    sections = {"sections": owners, "document": "Admin 行政, ext. 8200"}
    assert contacts.owner(sections, "4. Canteen 食堂 › Menus") == ADMIN  # the nearest section's
    assert contacts.owner(sections, "5. Parking") == "Admin 行政, ext. 8200"
    assert contacts.owner({"sections": owners}, "5. Parking") is None
    assert contacts.owner({}, "") is None


def test_a_section_pointing_to_two_teams_alike_names_neither():
    owners = owners_of(COMPANY.replace("## 5. Parking\n", "## 5. Parking\n\nAsk 8000 or 8300.\n"))
    assert "5. Parking" not in owners


@pytest.mark.parametrize("edition", range(len(HANDBOOKS)))
def test_the_demo_handbooks_name_their_own_teams(edition):
    """Both editions of the demo company's handbook: HR questions go to HR, expenses to
    Finance, office life to Admin, not all to the IT help desk."""
    path, _ = HANDBOOKS[edition]
    owners = owners_of(path.read_text(encoding="utf-8"))
    assert "8000" in owners["3. HR 人力资源"] and "hr@" in owners["3. HR 人力资源"]
    assert "8300" in owners["4. Expenses 报销"]
    assert "8200" in owners["7. Office life 办公生活"]
    assert "8350" in owners["5. Travel 差旅"]
    assert "8500" in owners["6. Security 信息与安全"]
    assert "8100" in owners["2. IT"]


def test_an_admins_contact_is_one_short_line():
    assert contacts.document_contact("  财务部\n分机 **8300** ") == "财务部 分机 8300"
    with pytest.raises(ValueError, match="longer than"):
        contacts.document_contact("x" * 201)


# -- stored with the document, on both databases ---------------------------------------------------
@pytest.fixture
def store(services):
    return KnowledgeStore(services)


def test_contacts_are_kept_sealed_with_the_document_and_survive_a_reindex(services, store):
    added = store.add(COMPANY.encode(), "公司手册", filename="company.md", contact="Admin 行政, ext. 8200")
    with services.db.session() as session:
        from app.models import KnowledgeDocument

        sealed = session.get(KnowledgeDocument, added.document_id).contacts_enc
    assert sealed and "行政" not in sealed and "ext." not in sealed  # sealed, not in clear (no encoding spells 行)
    assert store.list()[0].contact == "Admin 行政, ext. 8200"
    retriever = Retriever(services)
    expenses = retriever.search("meals on business trips per day", []).passages[0]
    parking = retriever.search("parking spaces lottery", []).passages[0]
    assert topic_contact(services, expenses) == FINANCE
    assert topic_contact(services, parking) == "Admin 行政, ext. 8200"
    assert store.reindex() == 1 and store.list()[0].contact == "Admin 行政, ext. 8200"
    # a new contact is a change: not "unchanged"
    assert store.add(COMPANY.encode(), "公司手册", contact="Facilities, ext. 8600").status == "replaced"
    assert topic_contact(services, retriever.search("parking spaces lottery", []).passages[0]) == \
        "Facilities, ext. 8600"
    with pytest.raises(UploadError, match="longer than"):
        store.add(COMPANY.encode(), "另一个", contact="y" * 300)


# -- the message path ------------------------------------------------------------------------------
def test_a_decline_names_the_team_that_owns_the_topic(services, store, monkeypatch):
    """Questions the documents do not answer: an HR one names HR, an expenses one Finance, a
    canteen one Admin (its contact line), one near no section the deployment's contact."""
    from app.web.factory import create_app

    monkeypatch.setattr(services.settings, "kb_fallback_contact", "总机 / switchboard 8888")
    monkeypatch.setattr(services.settings, "kb_min_score", 0.9)  # nothing is an answer here
    store.add(COMPANY.encode(), "公司手册", filename="company.md")
    app, llm = create_app(services=services), PromptLLM()
    processor = processor_with(services, llm)
    asked = {
        "how many days of sick leave are paid in full?": HR,
        "can I claim a taxi to the airport on expenses?": FINANCE,
        "is there a vegetarian lunch in the canteen?": ADMIN,
        "what is the weather on Mars?": "总机 / switchboard 8888",
    }
    for number, (question, team) in enumerate(asked.items()):
        reply = ask(app, services, processor, "bob-sales", question, 900 + number)
        assert "could not find" in reply and team in reply, (question, reply)
    assert llm.prompts == []  # declined by retrieval, no model call


def test_the_models_own_decline_names_the_topics_team_too(services, store, monkeypatch):
    from app.web.factory import create_app

    store.add(COMPANY.encode(), "公司手册", filename="company.md")
    llm = PromptLLM("Sorry, I could not find this in the knowledge base.")
    reply = ask(create_app(services=services), services, processor_with(services, llm), "bob-sales",
                "how many days of annual leave in the first year?", 950)
    assert "Passages" in llm.prompts[-1][0]["content"]
    assert reply == not_found_reply(HR) and "Sources" not in reply


def test_the_cli_sets_a_documents_contact(services, tmp_path, monkeypatch):
    from app.cli import cli

    document = tmp_path / "policy.md"
    document.write_text("# Policy\n\n## Gifts\n\nGifts over 200 RMB are declared.\n", encoding="utf-8")
    monkeypatch.setattr("app.cli._services", lambda: services)
    result = CliRunner().invoke(cli, ["kb", "add", str(document), "--title", "Gifts",
                                      "--contact", "Compliance 合规部, ext. 8700"])
    assert result.exit_code == 0, result.output
    assert KnowledgeStore(services).list()[0].contact == "Compliance 合规部, ext. 8700"
    result = CliRunner().invoke(cli, ["kb", "add", str(document), "--title", "Gifts", "--contact", "z" * 300])
    assert result.exit_code != 0 and "longer than 200" in result.output
