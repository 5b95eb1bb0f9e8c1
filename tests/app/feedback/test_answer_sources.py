"""👎 tied to sources (app/feedback/sources.py, app.feedback.ratings's card reasons) on both databases: an
answer's cited passages recorded once and sealed; the report groups the ratings by document and
section, worst first, with the reasons from both channels; the app card's drop-down reason is
parsed from WeCom's SelectedItems and stored with the 👎."""

from __future__ import annotations

import json

from sqlalchemy import select

from app.db import utcnow
from app.feedback import ratings as feedback
from app.feedback import sources as answer_sources
from app.knowledge.retrieval import Passage
from app.models import AnswerRating, AnswerSource, InboundMessage
from app.outbox.rows import TABLE
from app.wecom.messages import parse_message

ASKER = "u" * 64


def passage(document_id: int, section: str, title: str = "员工手册") -> Passage:
    return Passage(chunk_id=document_id * 100 + len(section), document_id=document_id, title=title,
                   section=section, text="...", score=1.0, coverage=1.0)


def answered(services, n: int) -> int:
    with services.db.transaction() as session:
        row = InboundMessage(dedup_hash=f"src{n}", user_hash=ASKER, msg_type="text", wecom_create_time=0,
                             status="answered", model="glm-4")
        session.add(row)
        session.flush()
        row.payload_enc = services.cipher.encrypt(json.dumps({"content": "q"}), TABLE, "payload_enc", row.id)
        return row.id


def test_sources_are_recorded_once_sealed_and_files_left_out(services):
    message = answered(services, 1)
    file = Passage(chunk_id=-1, document_id=0, title="policy.pdf", section="", text="x", score=0, coverage=1)
    cited = [passage(1, "3. HR › 育儿假"), file, passage(2, "4. Expenses")]
    assert answer_sources.record(services, message, cited) == 2
    assert answer_sources.record(services, message, cited) == 0  # a retried task
    with services.db.session() as session:
        rows = session.scalars(select(AnswerSource).order_by(AnswerSource.position)).all()
        assert [(r.position, r.document_id) for r in rows] == [(1, 1), (2, 2)]
        assert all("员工手册" not in (r.source_enc or "") and "育儿假" not in r.section_key for r in rows)
        assert services.cipher.decrypt(rows[0].source_enc, "answer_sources", "source_enc", rows[0].id) == \
            "员工手册 › 3. HR › 育儿假"


def test_the_report_groups_ratings_by_cited_section_worst_first(services):
    tz = services.settings.timezone
    leave, hotels, taxis = passage(1, "3. HR › 育儿假"), passage(2, "5. Travel › Hotels"), passage(2, "5. Travel › Taxis")
    plan = [([leave], -1, (2,)), ([leave, hotels], -1, (3,)), ([leave], 1, ()), ([hotels], -1, ()),
            ([taxis], 1, ()), ([hotels], 1, ())]
    for n, (cited, rating, reasons) in enumerate(plan, 10):
        message = answered(services, n)
        answer_sources.record(services, message, cited)
        assert feedback.record_rating(services, message, ASKER, rating, tz, reasons=reasons) == \
            feedback.Recorded.STORED
    today = utcnow().astimezone(tz).date()
    with services.db.session() as session:
        report = answer_sources.worst_sources(session, services, today, today)
    assert [(r["source"], r["down"], r["up"]) for r in report] == [
        ("员工手册 › 3. HR › 育儿假", 2, 1), ("员工手册 › 5. Travel › Hotels", 2, 1)]  # taxis: no 👎
    assert sorted(report[0]["reasons"]) == [f"{feedback.REASONS[2]} ×1", f"{feedback.REASONS[3]} ×1"]
    assert report[0]["percent"] == 33.3 and len(report[0]["messages"]) == 2
    with services.db.session() as session:
        assert answer_sources.worst_sources(session, services, today, today, department="nobody") == []


def test_the_cards_drop_down_reason_comes_with_the_click(services):
    card = feedback.build_card("fb-1-0123456789abcdef")
    selection = card["button_selection"]
    assert selection["question_key"] == feedback.REASON_KEY and len(selection["option_list"]) <= 10
    assert [o["id"] for o in selection["option_list"]][0] == selection["selected_id"] == feedback.NO_REASON
    message = answered(services, 30)
    task = feedback.task_id(services.blind_index, message)
    xml = (f"<xml><ToUserName><![CDATA[corp]]></ToUserName><FromUserName><![CDATA[zhangwei]]></FromUserName>"
           f"<CreateTime>1</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[template_card_event]]>"
           f"</Event><EventKey><![CDATA[{feedback.DOWN}]]></EventKey><TaskId><![CDATA[{task}]]></TaskId>"
           f"<CardType><![CDATA[button_interaction]]></CardType><ResponseCode><![CDATA[rc]]></ResponseCode>"
           f"<SelectedItems><SelectedItem><QuestionKey><![CDATA[{feedback.REASON_KEY}]]></QuestionKey>"
           f"<OptionIds><OptionId><![CDATA[3]]></OptionId></OptionIds></SelectedItem></SelectedItems>"
           f"<AgentID>1</AgentID></xml>")
    event = parse_message(xml.encode())
    assert event.selected == {feedback.REASON_KEY: ["3"]}
    payload = {"task_id": event.task_id, "event_key": event.event_key, "selected": event.selected}
    click = feedback.parse_click(services.blind_index, payload)
    assert click.rating == -1 and click.reasons == (3,)
    assert feedback.parse_click(services.blind_index, {**payload, "selected": {feedback.REASON_KEY: ["0"]}}
                                ).reasons == ()  # "no reason" is none
    assert feedback.parse_click(services.blind_index, {**payload, "selected": {feedback.REASON_KEY: ["9"]}}
                                ).reasons == ()  # not an option of ours
    up = feedback.parse_click(services.blind_index, {**payload, "event_key": feedback.UP})
    assert up.rating == 1 and up.reasons == ()  # a 👍 has no reasons
    feedback.record_rating(services, message, ASKER, -1, services.settings.timezone, reasons=click.reasons)
    with services.db.session() as session:
        assert session.scalar(select(AnswerRating.reasons).where(AnswerRating.message_id == message)) == "3"


def test_two_cards_rated_within_one_second_are_two_events():
    def click(task):
        return parse_message((f"<xml><ToUserName>c</ToUserName><FromUserName>lina</FromUserName><CreateTime>7"
                              f"</CreateTime><MsgType>event</MsgType><Event>template_card_event</Event><EventKey>"
                              f"{feedback.DOWN}</EventKey><TaskId>{task}</TaskId><AgentID>1</AgentID></xml>").encode())

    assert click("fb-1-a").dedup_key != click("fb-2-b").dedup_key
    assert click("fb-1-a").dedup_key == click("fb-1-a").dedup_key  # WeCom's retry of one click
