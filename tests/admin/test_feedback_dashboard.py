"""The dashboard's feedback panels: satisfaction for admin and finance, the worst-rated answers
(question and answer decrypted) for the admin role only."""

from __future__ import annotations

import json

from app import feedback
from app.models import InboundMessage
from app.outbox import TABLE

QUESTION, ANSWER = "SECRET-Q 报销要几天", "SECRET-A 三个工作日"


def _rated(services, rating: int) -> int:
    cipher = services.cipher
    with services.db.transaction() as session:
        row = InboundMessage(dedup_hash=f"fb{rating}", user_hash="u" * 64, msg_type="text",
                             wecom_create_time=0, status="answered", model="glm-4")
        session.add(row)
        session.flush()
        row.payload_enc = cipher.encrypt(json.dumps({"content": QUESTION}), TABLE, "payload_enc", row.id)
        row.reply_enc = cipher.encrypt(ANSWER, TABLE, "reply_enc", row.id)
        message_id = row.id
    assert feedback.record_rating(services, message_id, "u" * 64, rating,
                                  services.settings.timezone) == feedback.Recorded.STORED
    return message_id


def test_admin_sees_satisfaction_and_the_worst_answers_finance_only_the_aggregates(as_role, services):
    _rated(services, 1)
    bad = _rated(services, -1)
    page = as_role("admin").get("/admin/dashboard").get_data(as_text=True)
    assert 'id="rated-up">1<' in page and 'id="rated-down">1<' in page
    assert 'id="satisfaction-percent">50.0%<' in page and "glm-4" in page
    assert 'id="worst-rated"' in page and f"#{bad}" in page
    assert QUESTION in page and ANSWER in page

    page = as_role("finance").get("/admin/dashboard").get_data(as_text=True)
    assert 'id="rated-up">1<' in page and 'id="satisfaction-models"' in page
    assert 'id="worst-rated"' not in page and QUESTION not in page and ANSWER not in page
