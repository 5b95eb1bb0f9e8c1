"""worker/media/handler.py: voice heard, images seen, files kept until /forget, and every failure
answered politely with its reason, against fakes of WeCom and the model and real Redis DB 12
(the ASR and vision servers are the project's small test servers)."""

from __future__ import annotations

import base64
import io
import os
import types

import pytest
import redis

from app.security import FieldCipher
from app.wecom.client import Media
from app.wecom.exceptions import InvalidMediaError, MediaRejectedError, WeComTransientError
from emulator import media as samples
from tests.support.audio_clips import tone
from tests.support.env import make_env, redis_url, settings_from
from tests.support.media_servers import FakeASRServer, FakeVisionServer
from worker import commands
from worker.delivery.reply import Reply
from worker.media import errors
from worker.media import handler as media
from worker.media.files import FileContexts
from worker.media.images import DEFAULT_IMAGE_QUESTION

REDIS_URL = redis_url(12)


# -- the handler against fakes ---------------------------------------------------------------------
class FakeWeCom:
    def __init__(self):
        self.media: dict[str, Media | Exception] = {}
        self.sent: list[str] = []

    def get_media(self, media_id, *, max_bytes, accept=()):
        found = self.media.get(media_id)
        if isinstance(found, Exception):
            raise found
        if found is None:
            raise InvalidMediaError(40007, "invalid media_id")
        if len(found.data) > max_bytes:
            raise MediaRejectedError("too big", too_large=True)
        if accept and not found.content_type.startswith(accept):
            raise MediaRejectedError("wrong type")
        return found

    def send(self, user, kind, content, **_):
        self.sent.append(content)


class FakeProcessor:
    """What MediaHandler is given (services, the WeCom client, the conversation's files) and what
    the processor does with its ``Question``: the model's answer (the vision model for real)."""

    def __init__(self, settings, client):
        cipher = FieldCipher({"k1": os.urandom(32)})
        self.services = types.SimpleNamespace(settings=settings, redis=client, cipher=cipher, aibot_crypto=None)
        self.wecom = FakeWeCom()
        self.files = FileContexts(client, cipher, settings.conversation_ttl_s)
        self.generated: list[dict] = []

    def answer(self, question: media.Question) -> Reply:
        text, images, llm = question.text, question.images, question.llm
        self.generated.append({"text": text, "images": images, "llm": llm})
        if llm is not None:  # the vision model, for real
            from app.llm import GenerationParams
            from worker.media.prompt import with_images

            messages = [{"role": "user", "content": text}]
            if images:
                messages[-1] = with_images(messages[-1], images)
            return question.reply(Reply(llm.generate(messages, GenerationParams(max_tokens=64)).text,
                                        usage={"model": "v"}))
        return question.reply(Reply(f"answer to {text}", usage={"model": "m"}))


class Lease:
    def check(self):
        pass


def row(msg_type, channel="wecom", id_=1):
    return types.SimpleNamespace(id=id_, msg_type=msg_type, channel=channel, user_hash="uh")


@pytest.fixture(scope="module")
def servers():
    asr, vision = FakeASRServer().start(), FakeVisionServer().start()
    yield asr, vision
    asr.stop()
    vision.stop()


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(REDIS_URL)
    mine = ["conv-files:conv-1", "media:heard:1"]
    client.delete(*mine)
    yield client
    client.delete(*mine)


def handler(redis_client, servers, **overrides):
    asr, vision = servers
    asr.fail_next = vision.fail_next = 0
    values = {"asr_base_url": asr.url, "asr_model": "test-asr", "vision_model": "test-vision",
              "vision_base_url": vision.url, "media_max_bytes": 64 * 1024, "asr_timeout_s": 2,
              "media_url_hosts": "127.0.0.1"}  # the emulator's
    values.update(overrides)
    processor = FakeProcessor(settings_from(make_env(), **values), redis_client)
    processor.media = media.MediaHandler(processor.services, processor.wecom, processor.files)
    processor.media.processor = processor  # for ``compose`` below: who answers its questions
    return processor.media, processor


def compose(h, r, payload, conversation="conv-1"):
    """(text, kind, usage) of the ``Reply``, for a message delivered by message/send: the
    handler's own, or the model's answer to its ``Question``."""
    composed = h.compose(r, "zhangsan", payload, Lease(), types.SimpleNamespace(streams=False), conversation)
    reply = h.processor.answer(composed) if isinstance(composed, media.Question) else composed
    return reply.text, reply.kind, reply.usage


def test_voice_is_transcribed_heard_first_then_answered(redis_client, servers):
    h, p = handler(redis_client, servers)
    p.wecom.media["v1"] = Media(samples.amr_clip(1.0), "audio/amr", "voice.amr")
    payload = {"media_id": "v1", "format": "amr"}
    reply, kind, usage = compose(h, row("voice"), payload)
    assert p.wecom.sent == ["🎤 年假有几天"]
    assert reply == "answer to 年假有几天" and payload["content"] == "年假有几天"
    assert servers[0].received[-1]["seconds"] >= 0.9
    compose(h, row("voice"), payload)  # a retry: heard once
    assert p.wecom.sent == ["🎤 年假有几天"]


@pytest.mark.parametrize("setup, settings, reason, notice", [
    ("expired", {}, "expired or unknown media_id", errors.EXPIRED),
    ("large", {}, "too large", "太大"),
    ("speex", {}, "not decoded", errors.VOICE_UNREADABLE),
    ("ok", {"asr_base_url": ""}, "ASR_BASE_URL not set", errors.VOICE_OFF),
    ("flac", {}, "not decoded: not AMR or MP3 audio (FLAC)", errors.VOICE_UNREADABLE),
    ("long", {"voice_max_duration_s": 3}, "voice: too long (over 3 s)", "太长了（上限 3 秒）"),
    ("video", {}, "media: ", errors.VOICE_UNREADABLE),
])
def test_voice_failures_are_polite_and_recorded(redis_client, servers, setup, settings, reason, notice):
    h, p = handler(redis_client, servers, **settings)
    p.wecom.media.update({"large": Media(b"#!AMR\n" + bytes(70 * 1024), "audio/amr"),
                          "speex": Media(os.urandom(2000), "audio/speex"),
                          "ok": Media(samples.amr_clip(), "audio/amr"),
                          "flac": Media(tone("flac", "flac", 1.0), "audio/flac"),
                          "long": Media(samples.handmade_amr(5.0), "audio/amr"),
                          "video": Media(b"\x00\x00\x00\x18ftypmp42", "video/mp4")})
    heard_before = len(servers[0].received)
    payload = {"media_id": setup}
    reply, _, usage = compose(h, row("voice"), payload)
    assert notice in reply and reason in usage["failure_reason"]
    assert payload["content"] is None and p.generated == []
    assert len(servers[0].received) == heard_before  # nothing reached the ASR server


def test_asr_or_wecom_down_is_retried_later(redis_client, servers):
    h, p = handler(redis_client, servers)
    p.wecom.media["v1"] = Media(samples.amr_clip(), "audio/amr")
    servers[0].fail_next = 1
    with pytest.raises(errors.MediaUnavailable):
        compose(h, row("voice"), {"media_id": "v1"})
    p.wecom.media["v2"] = WeComTransientError(None, "timeout")
    with pytest.raises(errors.MediaUnavailable):
        compose(h, row("voice"), {"media_id": "v2"})
    h2, _ = handler(redis_client, servers, asr_base_url="http://127.0.0.1:9/v1")
    h2.wecom.media["v1"] = Media(samples.amr_clip(), "audio/amr")
    with pytest.raises(errors.MediaUnavailable):
        compose(h2, row("voice"), {"media_id": "v1"})


def test_image_goes_to_the_vision_model_with_the_text(redis_client, servers):
    h, p = handler(redis_client, servers)
    p.wecom.media["i1"] = Media(samples.png_image(), "image/png")
    payload = {"media_id": "i1"}
    reply, _, _ = compose(h, row("image"), payload)
    assert reply.startswith("看到1张图片(32x24 PNG): ") and DEFAULT_IMAGE_QUESTION in reply
    assert servers[1].problems == []
    assert payload["content"].startswith("[图片")


def test_without_a_vision_model_an_image_gets_a_notice_and_mixed_text_an_answer(redis_client, servers):
    h, p = handler(redis_client, servers, vision_model="")
    reply, _, usage = compose(h, row("image"), {"media_id": "i1"})
    assert reply == errors.IMAGES_OFF and "VISION_MODEL" in usage["failure_reason"]
    reply, _, _ = compose(h, row("mixed", channel="aibot"), {"content": "这是什么", "image_urls": ["https://x"]})
    assert reply == media.IMAGES_SKIPPED + "answer to 这是什么"


def test_a_file_becomes_context_until_forget(redis_client, servers):
    h, p = handler(redis_client, servers)
    p.wecom.media["f1"] = Media(samples.pdf_document(["Hotels: 600 RMB a night"]), "application/pdf", "travel.pdf")
    reply, _, usage = compose(h, row("file", id_=5), {"media_id": "f1"})
    assert "travel.pdf" in reply and usage == {}
    compose(h, row("file", id_=5), {"media_id": "f1"})  # a retry keeps one copy
    files = h.files.files("conv-1")
    assert [f["name"] for f in files] == ["travel.pdf"] and "600 RMB" in files[0]["text"]
    raw = b"".join(redis_client.lrange("conv-files:conv-1", 0, -1))
    assert b"600 RMB" not in raw and b"travel" not in raw  # sealed
    assert 0 < redis_client.ttl("conv-files:conv-1") <= 86400
    context = commands.CommandContext("zhangsan", "uh", "", files=p.files, conversation_key="conv-1")
    assert "1" in commands.run("forget", context)
    assert h.files.files("conv-1") == []
    assert "没有" in commands.run("forget", context)


@pytest.mark.parametrize("data, name, notice", [
    (b"\x89PNG\r\n\x1a\n" + bytes(100), "x.png", "读不了"),
    (b"<html><body><p>hi</p></body></html>", "x.html", errors.FILE_UNSUPPORTED),
    (b"", "empty.txt", "读不了"),
])
def test_unreadable_or_unsupported_files_are_refused_politely(redis_client, servers, data, name, notice):
    h, p = handler(redis_client, servers)
    p.wecom.media["f"] = Media(data, "application/octet-stream", name)
    reply, _, usage = compose(h, row("file"), {"media_id": "f"})
    assert notice in reply and usage["failure_reason"].startswith("file:")
    assert h.files.files("conv-1") == []


def test_text_file_markdown_and_docx_are_read(redis_client, servers):
    import docx

    document = docx.Document()
    document.add_paragraph("Meal allowance 100 RMB per day.")
    out = io.BytesIO()
    document.save(out)
    h, p = handler(redis_client, servers)
    for index, (data, name) in enumerate([(out.getvalue(), "meals.docx"), ("# 制度\n\n加班按1.5倍计。".encode(), "a.md"),
                                          ("纯文本说明".encode(), "b.txt")]):
        p.wecom.media[name] = Media(data, "application/octet-stream", name)
        reply, _, _ = compose(h, row("file", id_=10 + index), {"media_id": name})
        assert name in reply
    texts = " ".join(f["text"] for f in h.files.files("conv-1"))
    assert "100 RMB" in texts and "1.5倍" in texts and "纯文本" in texts


def test_a_slow_asr_server_is_retried_later(redis_client, servers):
    h, p = handler(redis_client, servers, asr_timeout_s=0.3)
    p.wecom.media["v1"] = Media(samples.amr_clip(), "audio/amr")
    servers[0].delay_s = 1.0
    try:
        with pytest.raises(errors.MediaUnavailable, match="Timeout"):
            compose(h, row("voice"), {"media_id": "v1"})
    finally:
        servers[0].delay_s = 0.0


def test_aibot_media_urls_are_fetched_and_decrypted(redis_client, servers):
    from app.wecom.crypto import WeComCrypto
    from emulator import EmulatorConfig, EmulatorServer

    # fixed keys: with no MAC, a random wrong key passes the padding check 1 run in 256
    key = base64.b64encode(bytes(range(100, 132))).decode()[:43]
    with EmulatorServer(EmulatorConfig(aibot_token="t", aibot_aes_key=key)) as emu:
        h, p = handler(redis_client, servers)
        p.services.aibot_crypto = WeComCrypto("t", key, "")
        url = f"{emu.url}/_emulator/aibot/media/"
        reply, _, _ = compose(h, row("image", channel="aibot"), {"content": "", "image_urls": [url + "emulator-image"]})
        assert reply.startswith("看到1张图片(32x24 PNG)")
        reply, _, usage = compose(h, row("file", channel="aibot"), {"file_url": url + "emulator-file"})
        assert "document.pdf" in reply and usage == {}
        reply, _, usage = compose(h, row("image", channel="aibot"), {"image_urls": [url + "gone"]})
        assert reply == errors.EXPIRED and "HTTP 404" in usage["failure_reason"]
        p.services.aibot_crypto = WeComCrypto("t", base64.b64encode(bytes(range(1, 33))).decode()[:43], "")
        reply, _, usage = compose(h, row("image", channel="aibot"), {"image_urls": [url + "emulator-image"]})
        assert reply == errors.EXPIRED and "key" in usage["failure_reason"]
        # the long connection's own aeskey (URL-safe base64 here) takes the bot key's place
        own = base64.urlsafe_b64encode(base64.b64decode(key + "=")).decode()
        reply, _, _ = compose(h, row("image", channel="aibot"), {"image_urls": [url + "emulator-image"],
                                                                 "media_keys": [own]})
        assert reply.startswith("看到1张图片")
        p.services.aibot_crypto = None
        reply, _, usage = compose(h, row("file", channel="aibot"), {"file_url": url + "emulator-file"})
        assert reply == errors.EXPIRED and "no AES key" in usage["failure_reason"]
    p.services.aibot_crypto = WeComCrypto("t", key, "")
    with pytest.raises(errors.MediaUnavailable):  # the URL's server gone: retried later
        compose(h, row("image", channel="aibot"), {"image_urls": [url + "emulator-image"]})
