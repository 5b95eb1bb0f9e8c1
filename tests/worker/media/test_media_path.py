"""Voice, images and files end to end: the emulator sends each kind (the app's XML callbacks with
media ids it serves from media/get; the AI bot's JSON with encrypted media URLs) -> gunicorn ->
outbox -> Celery -> worker/media/ -> a test ASR server / a test vision server / the chat model
-> WeCom. The test servers check what they receive (a 16 kHz WAV; a text part and a PNG data URL
together); the outbox rows end answered, or failed, with the reason.
"""

from __future__ import annotations

import base64

import pytest

from emulator import media as samples
from scripts.dev_env import random_aes_key
from tests.support.audio_clips import tone
from tests.support.media_servers import FakeASRServer, FakeVisionServer
from tests.support.stack import Stack, select_rows, wait_for
from worker.media import errors as media
from worker.processor import FAILURE_NOTICE

pytestmark = pytest.mark.integration
HEARD = "年假有几天"


@pytest.fixture(scope="module")
def servers():
    asr, vision = FakeASRServer(text=HEARD).start(), FakeVisionServer().start()
    yield asr, vision
    asr.stop()
    vision.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(servers, tmp_path_factory, request):
    asr, vision = servers
    s = Stack(tmp_path_factory.mktemp(f"media-{request.param}"), db_kind=request.param, redis_db=11, extra_env={
        "ASR_BASE_URL": asr.url, "ASR_MODEL": "test-asr", "ASR_TIMEOUT_S": "3",
        "VISION_MODEL": "test-vision", "VISION_BASE_URL": vision.url, "VISION_TIMEOUT_S": "5",
        "MEDIA_MAX_BYTES": str(256 * 1024), "TASK_MAX_RETRIES": "2",
        "AIBOT_TOKEN": "aibot-token-for-tests", "AIBOT_ENCODING_AES_KEY": random_aes_key(),
        "AIBOT_NAME": "小星", "AIBOT_REFRESH_THROTTLE_S": "0"},
        emulator_options={"aibot_poll_interval": 0.1}).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def employees(stack):
    return iter([u["userid"] for u in stack.emu("GET", "directory")["users"]])


@pytest.fixture
def user(employees):
    """A different employee for each test: each conversation starts empty."""
    return next(employees)


def rows_for(stack, msg_type):
    return select_rows(stack.db.url, "SELECT id, status, failure_reason, channel FROM inbound_messages "
                                     f"WHERE msg_type = '{msg_type}' ORDER BY id")


def new_replies(stack, user, start, count, timeout=60):
    wait_for(lambda: len(stack.replies(user)) - start >= count, timeout, 0.3, f"{count} replies")
    return stack.replies(user)[start:]


def upload(stack, data: bytes, content_type: str, filename: str = "") -> str:
    return stack.emu("POST", "media", json={"data_b64": base64.b64encode(data).decode(),
                                            "content_type": content_type, "filename": filename})["media_id"]


def test_voice_is_heard_then_answered(stack, servers, user):
    start = len(stack.replies(user))
    stack.send(user, msg_type="voice")  # the emulator's own AMR clip
    got = new_replies(stack, user, start, 2)
    assert got == [f"🎤 {HEARD}", f"答复#1: {HEARD}"], got
    assert servers[0].received and servers[0].received[-1]["seconds"] >= 0.9
    assert servers[0].problems == []
    assert rows_for(stack, "voice")[-1]["status"] == "answered"


def test_image_goes_to_the_vision_server(stack, servers, user):
    start = len(stack.replies(user))
    stack.send(user, msg_type="image")
    got = new_replies(stack, user, start, 1)
    assert got[0].startswith("看到1张图片(32x24 PNG): "), got
    assert servers[1].problems == []
    assert rows_for(stack, "image")[-1]["status"] == "answered"


def test_a_file_becomes_context_for_the_next_question_until_forget(stack, user):
    start = len(stack.replies(user))
    stack.send(user, msg_type="file", wait=True)  # the emulator's policy.pdf
    got = new_replies(stack, user, start, 1)
    assert "policy.pdf" in got[0] and "/forget" in got[0]
    before = stack.model.calls
    stack.send(user, "北京住宿标准是多少？", wait=True)
    new_replies(stack, user, start, 2)
    assert stack.model.calls == before + 1
    system = [m["content"] for m in stack.model.last_body["messages"] if m["role"] == "system"]
    assert any("Hotels in Beijing: up to 600 RMB per night." in c for c in system), system
    stack.send(user, "/forget", wait=True)
    assert "1" in new_replies(stack, user, start, 3)[2]
    stack.send(user, "再问一次", wait=True)
    new_replies(stack, user, start, 4)
    assert not any("600 RMB" in m["content"] for m in stack.model.last_body["messages"]
                   if isinstance(m["content"], str))


def test_failures_are_polite_and_recorded(stack, servers, user):
    start = len(stack.replies(user))
    # an expired media id
    media_id = upload(stack, b"#!AMR\n" + bytes(320), "audio/amr")
    stack.emu("POST", f"media/{media_id}/expire")
    stack.send(user, msg_type="voice", media_id=media_id, wait=True)
    # too large (MEDIA_MAX_BYTES is 256 KB)
    big = upload(stack, b"%PDF-1.4\n" + bytes(300 * 1024), "application/pdf", "big.pdf")
    stack.send(user, msg_type="file", media_id=big, wait=True)
    # not audio the decoder knows
    odd = upload(stack, bytes(range(256)) * 8, "audio/speex")
    stack.send(user, msg_type="voice", media_id=odd, wait=True)
    got = new_replies(stack, user, start, 3)
    assert got == [media.EXPIRED, media.TOO_LARGE.format(limit="256 KB"), media.VOICE_UNREADABLE], got
    reasons = [r["failure_reason"] for r in rows_for(stack, "voice")[-2:]] + [rows_for(stack, "file")[-1]["failure_reason"]]
    assert "expired" in reasons[0] and "not decoded" in reasons[1] and "too large" in reasons[2], reasons
    assert all(r["status"] == "answered" for r in rows_for(stack, "voice")[-2:])


def test_voice_in_another_format_or_too_long_is_refused_before_decoding(stack, servers, user):
    """A FLAC (PyAV would decode any container) and 100 s of AMR (over VOICE_MAX_DURATION_S=90):
    each gets its notice, and the ASR server hears neither."""
    start, heard = len(stack.replies(user)), len(servers[0].received)
    flac = upload(stack, tone("flac", "flac", 1.0), "audio/flac")
    stack.send(user, msg_type="voice", media_id=flac, wait=True)
    long = upload(stack, samples.handmade_amr(100.0), "audio/amr")
    stack.send(user, msg_type="voice", media_id=long, wait=True)
    got = new_replies(stack, user, start, 2)
    assert got == [media.VOICE_UNREADABLE, media.VOICE_TOO_LONG.format(limit="90")], got
    reasons = [r["failure_reason"] for r in rows_for(stack, "voice")[-2:]]
    assert "not AMR or MP3 audio (FLAC)" in reasons[0] and "too long (over 90 s)" in reasons[1], reasons
    assert len(servers[0].received) == heard


def test_asr_down_is_retried_then_failed_with_the_reason(stack, servers, user):
    asr = servers[0]
    start = len(stack.replies(user))
    asr.fail_next = 1  # one failure: the retry succeeds
    stack.send(user, msg_type="voice")
    assert new_replies(stack, user, start, 2) == [f"🎤 {HEARD}", f"答复#1: {HEARD}"]
    assert asr.fail_next == 0
    asr.fail_next = 100  # down for good: TASK_MAX_RETRIES=2, then the failure notice
    stack.send(user, msg_type="voice")
    got = new_replies(stack, user, start, 3)
    assert got[-1] == FAILURE_NOTICE
    row = rows_for(stack, "voice")[-1]
    assert row["status"] == "failed" and "asr: HTTP 503" in row["failure_reason"], row
    asr.fail_next = 0


def test_vision_server_down_fails_politely(stack, servers, user):
    vision = servers[1]
    start = len(stack.replies(user))
    vision.fail_next = 100
    stack.send(user, msg_type="image")
    got = new_replies(stack, user, start, 1, timeout=90)
    vision.fail_next = 0
    assert got[-1] == FAILURE_NOTICE
    row = rows_for(stack, "image")[-1]
    assert row["status"] == "failed" and "model" in row["failure_reason"], row


# -- the AI bot ------------------------------------------------------------------------------------
def bot_turn(stack, user, **body) -> dict:
    sent = stack.emu("POST", "aibot/send", json={"from_user": user, **body})

    def finished():
        found = stack.emu("GET", "aibot/conversations", params={"delivery_id": sent["delivery_id"]})
        c = found["conversations"][0]
        return c["status"] not in ("pending", "streaming") and c

    return wait_for(finished, 60, 0.2, "the stream to finish")


def test_aibot_voice_image_mixed_and_file(stack, servers, user):
    voice = bot_turn(stack, user, msg_type="voice", content="报销流程是什么")
    assert voice["final"].endswith("报销流程是什么"), voice  # WeCom's transcript, answered as text
    image = bot_turn(stack, user, msg_type="image")
    assert image["final"].startswith("看到1张图片(32x24 PNG)"), image
    mixed = bot_turn(stack, user, msg_type="mixed", content="这两张图有什么不同",
                     media_ids=["emulator-image", "emulator-image"])
    assert mixed["final"] == "看到2张图片(32x24 PNG, 32x24 PNG): 这两张图有什么不同", mixed
    file = bot_turn(stack, user, msg_type="file")
    assert "/forget" in file["final"], file
    assert servers[1].problems == []
    rows = select_rows(stack.db.url, "SELECT msg_type, status FROM inbound_messages WHERE channel = 'aibot'")
    assert {r["msg_type"] for r in rows} >= {"voice", "image", "mixed", "file"}
    assert all(r["status"] == "answered" for r in rows), rows
