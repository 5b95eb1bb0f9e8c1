"""The 👎 report in headless Chromium: the documents and sections that the worst-rated answers
cited, most 👎 first with their reasons, on the dashboard of the admin role (not finance's)."""

from __future__ import annotations

import json

import pytest

from app.feedback import ratings as feedback
from app.feedback import sources as answer_sources
from app.knowledge.retrieval import Passage
from app.models import InboundMessage
from app.outbox.rows import TABLE
from tests.support.browser import sign_in

pytestmark = pytest.mark.browser
ASKER = "r" * 64


def rated_answer(services, n: int, cited: list[Passage], rating: int, reasons=()) -> int:
    with services.db.transaction() as session:
        row = InboundMessage(dedup_hash=f"report{n}", user_hash=ASKER, msg_type="text", wecom_create_time=0,
                             status="answered", model="glm-4")
        session.add(row)
        session.flush()
        row.payload_enc = services.cipher.encrypt(json.dumps({"content": "孩子两岁有育儿假吗"}), TABLE,
                                                  "payload_enc", row.id)
        message = row.id
    answer_sources.record(services, message, cited)
    feedback.record_rating(services, message, ASKER, rating, services.settings.timezone, reasons=reasons)
    return message


def test_admins_see_which_documents_to_fix(page, site):
    services = site.services
    leave = Passage(chunk_id=9001, document_id=901, title="员工手册", section="3. HR › 育儿假 Childcare leave",
                    text="...", score=1, coverage=1)
    hotels = Passage(chunk_id=9002, document_id=902, title="差旅制度", section="住宿 Hotels", text="...",
                     score=1, coverage=1)
    worst = [rated_answer(services, n, [leave], -1, (2,)) for n in range(3)]
    rated_answer(services, 3, [hotels], -1, (3,))
    rated_answer(services, 4, [hotels], 1)

    sign_in(page, "admin")
    page.goto("/admin/dashboard")
    table = page.locator("#worst-sources table")
    rows = table.locator("tr")
    first, second = rows.nth(1).inner_text(), rows.nth(2).inner_text()
    assert "员工手册 › 3. HR › 育儿假 Childcare leave" in first and "\t3\t0\t0.0%" in first
    assert f"{feedback.REASONS[2]} ×3" in first and all(f"#{m}" in first for m in worst)
    assert "差旅制度 › 住宿 Hotels" in second and "\t1\t1\t50.0%" in second
    assert feedback.REASONS[3] in second

    page.context.clear_cookies()
    sign_in(page, "finance")
    page.goto("/admin/dashboard")
    assert page.locator("#worst-sources").count() == 0 and "育儿假" not in page.content()
