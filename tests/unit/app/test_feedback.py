"""app.feedback without a database: the card, its task id, the click's parsing."""

from __future__ import annotations

from app import feedback
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
