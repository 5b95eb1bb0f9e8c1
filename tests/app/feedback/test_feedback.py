"""app.feedback.ratings without a database: the card, its task id, the click's parsing."""

from __future__ import annotations

from app.feedback import ratings as feedback
from app.security.blind_index import BlindIndex
from app.wecom.messages import TemplateCardEvent, parse_message
from emulator.callbacks import build_callback_xml

INDEX = BlindIndex([b"k" * 32])
OLD_AND_NEW = BlindIndex([b"n" * 32, b"k" * 32])  # a rotation under way: the old key second


def test_the_card_is_a_button_interaction_card_keyed_by_the_message():
    task = feedback.task_id(INDEX, 1234)
    card = feedback.build_card(task)
    assert card["card_type"] == "button_interaction" and card["task_id"] == task
    assert [b["key"] for b in card["button_list"]] == [feedback.UP, feedback.DOWN]
    assert ["👍" in card["button_list"][0]["text"], "👎" in card["button_list"][1]["text"]] == [True, True]
    assert card["main_title"]["title"]
    # WeCom: task_id at most 128 bytes of digits, letters, _ - @
    assert len(task) <= 128 and all(c.isalnum() or c in "_-@" for c in task)


def test_task_ids_are_checked_and_survive_a_key_rotation():
    task = feedback.task_id(INDEX, 77)
    assert feedback.message_of(INDEX, task) == 77
    assert feedback.message_of(OLD_AND_NEW, task) == 77
    assert feedback.message_of(INDEX, task.replace("fb-77-", "fb-78-")) is None  # another message
    assert feedback.message_of(INDEX, "fb-77-" + "0" * 16) is None
    for junk in ("", "fb-", "fb-x-abc", "task-1", task + " "):
        assert feedback.message_of(INDEX, junk) is None


def test_rating_of_keys():
    assert feedback.rating_of(feedback.UP) == 1 and feedback.rating_of(feedback.DOWN) == -1
    assert feedback.rating_of("other") is None and feedback.rating_of("") is None


def test_the_emulators_card_event_parses_and_becomes_a_click():
    task = feedback.task_id(INDEX, 5)
    xml = build_callback_xml("wwcorp", 1000002, {
        "from_user": "zhangwei", "event": "template_card_event", "event_key": feedback.DOWN,
        "task_id": task, "card_type": "button_interaction", "response_code": "rc1"}, 1700000000, None)
    event = parse_message(xml)
    assert isinstance(event, TemplateCardEvent)
    assert (event.event_key, event.task_id, event.card_type, event.response_code) == (
        feedback.DOWN, task, "button_interaction", "rc1")
    payload = {"event_key": event.event_key, "task_id": event.task_id, "response_code": event.response_code}
    assert feedback.parse_click(INDEX, payload) == feedback.CardClick(5, -1, "rc1")
    assert feedback.parse_click(INDEX, dict(payload, event_key="x")) is None
    assert feedback.parse_click(INDEX, dict(payload, task_id="fb-6-" + task[-16:])) is None


# -- the AI bot's own 👍/👎: feedback.id on the first reply, the feedback_event ---------------------
def _feedback_event(**event) -> str:
    import json

    body = {"msgid": "ev-1", "create_time": 1700000000, "aibotid": "aib1", "chattype": "single",
            "from": {"userid": "zhangwei"}, "msgtype": "event",
            "event": {"eventtype": "feedback_event", "feedback_event": event}}
    return json.dumps(body, ensure_ascii=False)


def test_the_first_stream_reply_carries_the_feedback_id_and_only_when_asked():
    from app.wecom import aibot, aibot_ws

    fid = feedback.feedback_id(INDEX, 31)
    assert fid == feedback.task_id(INDEX, 31) and len(fid.encode()) <= feedback.FEEDBACK_ID_MAX_BYTES
    assert aibot.stream_message("S", "…", False, feedback_id=fid)["stream"] == {
        "id": "S", "finish": False, "content": "…", "feedback": {"id": fid}}
    assert "feedback" not in aibot.stream_message("S", "…", False)["stream"]
    frame = aibot_ws.respond_stream("req", "S", "…", False, feedback_id=fid)
    assert frame.body["stream"]["feedback"] == {"id": fid}
    assert "feedback" not in aibot_ws.respond_stream("req", "S", "…", False).body["stream"]


def test_feedback_is_offered_for_questions_not_commands_and_follows_the_setting():
    from types import SimpleNamespace

    on, off = SimpleNamespace(feedback_cards=True), SimpleNamespace(feedback_cards=False)
    assert feedback.offers_feedback(on, "年假有几天？") and feedback.offers_feedback(on, "")
    assert not feedback.offers_feedback(on, "/help") and not feedback.offers_feedback(on, " ／reset")
    assert not feedback.offers_feedback(off, "年假有几天？")


def test_a_feedback_event_parses_into_an_aibot_rating():
    from app.wecom import aibot

    fid = feedback.feedback_id(INDEX, 12)
    down = aibot.parse_message(_feedback_event(id=fid, type=2, content="SENTINEL 过时了",
                                               inaccurate_reason_list=[3, 1, 9, "x"]), 0)
    assert (down.msg_type, down.event, down.msg_id, down.from_user) == ("event", "feedback_event", "ev-1", "zhangwei")
    assert (down.feedback_id, down.feedback_type, down.content) == (fid, 2, "SENTINEL 过时了")
    assert feedback.aibot_problem(down) is None
    import dataclasses
    import json

    payload = json.loads(json.dumps(dataclasses.asdict(down)))  # as the outbox stores it
    rated = feedback.parse_aibot_feedback(INDEX, payload)
    assert rated == feedback.AibotFeedback(12, 2, (1, 3), "SENTINEL 过时了") and rated.rating == -1
    up = aibot.parse_message(_feedback_event(id=fid, type=1, content="ignored", inaccurate_reason_list=[1]), 0)
    rated = feedback.parse_aibot_feedback(OLD_AND_NEW, json.loads(json.dumps(dataclasses.asdict(up))))
    assert rated == feedback.AibotFeedback(12, 1, (), "") and rated.rating == 1  # reasons only for 👎
    withdrawn = aibot.parse_message(_feedback_event(id=fid, type="3"), 0)
    assert feedback.parse_aibot_feedback(INDEX, dataclasses.asdict(withdrawn)).rating == 0
    assert feedback.reason_labels("1,3") == [feedback.REASONS[1], feedback.REASONS[3]]
    assert feedback.reason_labels("") == []


def test_malformed_or_foreign_feedback_events_say_why():
    from app.wecom import aibot

    fid = feedback.feedback_id(INDEX, 12)
    for event, why in [({"type": 1}, "no feedback_event.id"), ({"id": fid, "type": 4}, "not 1, 2 or 3"),
                       ({"id": fid, "type": "up"}, "not 1, 2 or 3"), ({"id": fid}, "not 1, 2 or 3"),
                       ({"id": "x" * 257, "type": 1}, "256 bytes"), ({"id": 5, "type": 1}, "no feedback_event.id")]:
        assert why in feedback.aibot_problem(aibot.parse_message(_feedback_event(**event), 0)), event
    no_body = aibot.parse_message('{"msgid": "e", "from": {"userid": "u"}, "msgtype": "event", '
                                  '"event": {"eventtype": "feedback_event", "feedback_event": "x"}}', 0)
    assert feedback.aibot_problem(no_body) == "no feedback_event.id"
    no_msgid = aibot.parse_message(_feedback_event(id=fid, type=1).replace('"ev-1"', '""'), 0)
    assert "msgid" in feedback.aibot_problem(no_msgid)
    for forged in ("fb-12-" + "0" * 16, "task-1", "", feedback.feedback_id(INDEX, 13)[:-1]):
        assert feedback.parse_aibot_feedback(INDEX, {"feedback_id": forged, "feedback_type": 1}) == \
            "unknown feedback id"
    assert feedback.parse_aibot_feedback(INDEX, {"feedback_id": fid, "feedback_type": 7}) == \
        "feedback type out of range"
