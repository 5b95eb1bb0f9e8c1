"""WeCom's duplicate check guards a message's own retries, never another message's answer: an
employee who asks the same thing twice gets the same words twice (on real Redis, both databases)."""

from __future__ import annotations

import time

import pytest

from app.web.factory import create_app
from tests.worker.test_processor_data import (
    SENTINEL_REPLY,
    USER_ID,
    FakeLLM,
    FakeWeCom,
    ids_of,
    post_message,
)
from worker.conversation import ConversationStore
from worker.delivery import duplicate_check
from worker.processor import MessageProcessor


class WeComWithDuplicateCheck(FakeWeCom):
    """message/send as WeCom treats ``enable_duplicate_check``: a request identical to one taken
    within its interval (the flag and interval are part of the request) is dropped, errcode 0."""

    def __init__(self):
        super().__init__()
        self.taken: dict[tuple, float] = {}
        self.dropped = 0

    def send(self, touser, kind, content, duplicate_check_interval=None, **_):
        request = (touser, kind, content, duplicate_check_interval)
        if duplicate_check_interval is not None:
            seen = self.taken.get(request)
            if seen is not None and time.time() - seen < duplicate_check_interval:
                self.dropped += 1
                return {"errcode": 0}
            self.taken[request] = time.time()
        return super().send(touser, kind, content)


@pytest.fixture
def clean_keys(services):
    for key in services.redis.scan_iter("wecom:sent:*"):
        services.redis.delete(key)
    return services


def test_the_first_message_owns_a_text_its_retries_keep_the_check_another_goes_without(clean_keys):
    services, window = clean_keys, clean_keys.settings.wecom_duplicate_check_s
    assert duplicate_check.interval_for(services, "user-a", 1, "年假 10 天") == window
    assert duplicate_check.interval_for(services, "user-a", 1, "年假 10 天") == window  # its retry
    assert duplicate_check.interval_for(services, "user-a", 2, "年假 10 天") is None  # asked again
    assert duplicate_check.interval_for(services, "user-a", 2, "另一个答案") == window
    assert duplicate_check.interval_for(services, "user-b", 3, "年假 10 天") == window  # someone else
    [key] = [k for k in services.redis.scan_iter("wecom:sent:*")
             if k.decode() == duplicate_check.key_for(services, "user-a", "年假 10 天")]
    assert "年假" not in key.decode() and "user-a" not in key.decode()
    assert 0 < services.redis.ttl(key) <= window + duplicate_check.MARGIN_S


def test_the_same_question_twice_is_answered_twice(clean_keys):
    services = clean_keys
    client = create_app(services=services).test_client()
    for msg_id in (5101, 5102):
        assert post_message(client, services, "年假有几天？", msg_id).status_code == 200
    wecom = WeComWithDuplicateCheck()
    processor = MessageProcessor(services, FakeLLM(), wecom,
                                 ConversationStore(services.redis, services.cipher, 3600, 20))
    for message_id in ids_of(services):
        processor.process(message_id)
    answers = [content for user, _, content in wecom.sent if user == USER_ID]
    assert len(answers) == 2 and all(SENTINEL_REPLY in a for a in answers)
    assert wecom.dropped == 0
