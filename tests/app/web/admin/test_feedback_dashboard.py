"""The dashboard's feedback panels: satisfaction for admin and finance, the worst-rated answers
(question and answer decrypted) for the admin role only."""

from __future__ import annotations

import json

from app.feedback import ratings as feedback
from app.models import InboundMessage
from app.outbox.rows import TABLE

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


def test_the_ai_bots_ratings_count_by_channel_with_their_reasons_and_a_withdrawal_counts_neither_way(
        as_role, services):
    _rated(services, 1)  # an app-channel 👍
    tz = services.settings.timezone
    ids = []
    for n in range(2):
        with services.db.transaction() as session:
            row = InboundMessage(dedup_hash=f"bot{n}", user_hash="b" * 64, msg_type="text", channel="aibot",
                                 wecom_create_time=0, status="answered", model="glm-4")
            session.add(row)
            session.flush()
            row.payload_enc = services.cipher.encrypt(json.dumps({"content": QUESTION}), TABLE,
                                                      "payload_enc", row.id)
            row.reply_enc = services.cipher.encrypt(ANSWER, TABLE, "reply_enc", row.id)
            ids.append(row.id)
    down = feedback.AibotFeedback(ids[0], feedback.AIBOT_INACCURATE, (2, 4), "")
    assert feedback.record_aibot_feedback(services, down, "b" * 64, tz) == feedback.Recorded.STORED
    up = feedback.AibotFeedback(ids[1], feedback.AIBOT_ACCURATE, (), "")
    assert feedback.record_aibot_feedback(services, up, "b" * 64, tz) == feedback.Recorded.STORED
    withdrawn = feedback.AibotFeedback(ids[1], feedback.AIBOT_WITHDRAWN, (), "")
    assert feedback.record_aibot_feedback(services, withdrawn, "b" * 64, tz) == feedback.Recorded.WITHDRAWN
    page = as_role("admin").get("/admin/dashboard").get_data(as_text=True)
    assert 'id="rated-up">1<' in page and 'id="rated-down">1<' in page  # the withdrawn 👍 is gone
    channels = page.split('id="satisfaction-channels"')[1].split("</table>")[0]
    assert ">aibot<" in channels and ">app<" in channels
    worst = page.split('id="worst-rated"')[1].split("</table>")[0]
    assert f"#{ids[0]}" in worst and feedback.REASONS[2] in worst and feedback.REASONS[4] in worst
