"""Composing gives a ``Reply``; delivering it is one interface with two channels."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import redis

from app.models import MessageStatus
from app.security.blind_index import BlindIndex
from app.wecom.exceptions import WeComTransientError
from worker.delivery import message_send
from worker.delivery.message_send import MessageSend
from worker.delivery.reply import RATE_LIMIT_NOTICE, Reply
from worker.delivery.stream import StreamDelivery
from worker.failures import TransientFailure


def test_a_stored_reply_knows_whether_it_was_the_rate_limit_notice():
    assert Reply.stored(RATE_LIMIT_NOTICE, None) == Reply(RATE_LIMIT_NOTICE, "text",
                                                          status=MessageStatus.RATE_LIMITED)
    assert Reply.stored("答", "markdown").status == MessageStatus.ANSWERED
    assert not Reply.nothing().sends and Reply.nothing().status == MessageStatus.IGNORED
    assert Reply.silenced().status == MessageStatus.RATE_LIMITED and Reply.silenced().reason


class _Lease:
    def check(self):
        pass


@contextlib.contextmanager
def _no_statements(db):
    yield None  # the worker's one-statement units of work (app.outbox.statements.standalone)


class _WeCom:
    def __init__(self, fail_at: int | None = None):
        self.sent, self.fail_at = [], fail_at

    def send(self, user_id, kind, text, duplicate_check_interval=0):
        if self.fail_at is not None and len(self.sent) == self.fail_at:
            raise WeComTransientError("busy")
        self.sent.append(text)


class _RedisDown:
    def set(self, *args, **kwargs):
        raise redis.ConnectionError("down")


def _services():
    settings = SimpleNamespace(wecom_duplicate_check_s=1800)
    return SimpleNamespace(db=None, redis=_RedisDown(), settings=settings, blind_index=BlindIndex("k" * 32))


def test_message_send_resumes_at_the_first_unsent_chunk_and_leaves_the_last_count_to_the_finish(monkeypatch):
    recorded = []
    monkeypatch.setattr(message_send, "standalone", _no_statements)
    monkeypatch.setattr(message_send.rows, "save_progress",
                        lambda session, message_id, owner, chunks_sent: recorded.append(chunks_sent) or True)
    wecom = _WeCom(fail_at=1)
    row = SimpleNamespace(id=7, chunks_sent=0, user_hash="u")
    channel = MessageSend(_services(), wecom)
    with pytest.raises(TransientFailure):
        channel.deliver(row, "me", "u", "text", ["a", "b", "c"], _Lease())
    assert wecom.sent == ["a"] and row.chunks_sent == 1 and recorded == [1]
    wecom.fail_at = None
    assert channel.deliver(row, "me", "u", "text", ["a", "b", "c"], _Lease()) == {"chunks_sent": 3}
    assert wecom.sent == ["a", "b", "c"] and recorded == [1, 2]


class _Writer:
    def __init__(self, finished: bool):
        self.finished, self.written = finished, []

    def finish(self, text):
        self.written.append(text)
        return not self.finished


def test_the_stream_is_finished_with_the_reply_or_reports_the_callback_closed_it():
    assert StreamDelivery(_Writer(False)).deliver(None, "me", "u", "text", ["答"], _Lease()) == {}
    closed = StreamDelivery(_Writer(True))
    assert closed.deliver(None, "me", "u", "text", ["答"], _Lease()) == {
        "failure_reason": "aibot: stream closed by the callback at the deadline"}
    writer = _Writer(False)
    StreamDelivery(writer).failed(None, None)
    assert writer.written == [""]
