"""Voice, image and file messages: parsing both channels' shapes, media/get against the emulator
(its real AMR, PNG and PDF), the AI bot's media encryption, and the client's refusals."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import wave

import pytest
import requests

from app.wecom import aibot
from app.wecom.client import WeComClient
from app.wecom.crypto import decode_aes_key, decrypt_media, encrypt_media
from app.wecom.exceptions import (
    DecryptAesError,
    IllegalBufferError,
    InvalidMediaError,
    MediaRejectedError,
    MessageParseError,
    WeComTransientError,
)
from app.wecom.messages import FileMessage, ImageMessage, VoiceMessage, parse_message
from emulator import EmulatorConfig, EmulatorServer
from emulator import media as samples
from emulator.callbacks import build_callback_xml

# fixed keys: the wrong-key case below must fail the padding check every run, not 255 in 256
AES_KEY = base64.b64encode(bytes(range(100, 132))).decode()[:43]


# -- parsing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, cls", [("image", ImageMessage), ("voice", VoiceMessage), ("file", FileMessage)])
def test_app_callback_media_messages_parse(kind, cls):
    xml = build_callback_xml("corp", 1000002, {"from_user": "zhangsan", "msg_type": kind}, 1700000000, 42)
    message = parse_message(xml)
    assert isinstance(message, cls) and message.msg_type == kind
    assert message.media_id == f"emulator-{kind}"
    if kind == "voice":
        assert message.format == "amr"
    if kind == "image":
        assert message.pic_url.startswith("https://")


def test_app_file_message_keeps_its_name_and_needs_a_media_id():
    base = ("<xml><ToUserName>c</ToUserName><FromUserName>u</FromUserName><CreateTime>1</CreateTime>"
            "<MsgType>file</MsgType><MsgId>7</MsgId><AgentID>1</AgentID>{}</xml>")
    message = parse_message(base.format("<MediaId>m1</MediaId><FileName>规章.pdf</FileName>"))
    assert message.file_name == "规章.pdf"
    with pytest.raises(MessageParseError):
        parse_message(base.format(""))


def _bot(msgtype: str, **body) -> bytes:
    return json.dumps({"msgid": "m1", "aibotid": "b", "chattype": "single", "from": {"userid": "u"},
                       "msgtype": msgtype, **body}).encode()


def test_aibot_media_messages_parse():
    voice = aibot.parse_message(_bot("voice", voice={"content": "年假有几天"}), 1)
    assert voice.content == "年假有几天" and voice.msg_type in aibot.QUESTION_TYPES
    image = aibot.parse_message(_bot("image", image={"url": "https://x/img"}), 1)
    assert image.image_urls == ("https://x/img",) and image.content == ""
    file = aibot.parse_message(_bot("file", file={"url": "https://x/f"}), 1)
    assert file.file_url == "https://x/f"
    mixed = aibot.parse_message(_bot("mixed", mixed={"msg_item": [
        {"msgtype": "text", "text": {"content": "这是什么"}},
        {"msgtype": "image", "image": {"url": "https://x/1"}},
        {"msgtype": "image", "image": {"url": "https://x/2"}}]}), 1)
    assert mixed.content == "这是什么" and mixed.image_urls == ("https://x/1", "https://x/2")
    with pytest.raises(MessageParseError):
        aibot.parse_message(_bot("image", image={}), 1)
    own = aibot.parse_message(_bot("image", image={"url": "https://x/i", "aeskey": "K"}), 1)
    assert own.media_keys == ("K",)
    assert aibot.parse_message(_bot("file", file={"url": "https://x/f", "aeskey": "F"}), 1).file_key == "F"
    assert mixed.media_keys == ("", "")


# -- the AI bot's encrypted media -----------------------------------------------------------------
def test_media_encryption_round_trip_and_wrong_key():
    key = decode_aes_key(AES_KEY)
    png = samples.png_image()
    sealed = encrypt_media(key, png)
    assert len(sealed) % 32 == 0 and sealed != png
    assert decrypt_media(key, sealed) == png
    # The media cipher is plain AES-CBC with PKCS#7 (no MAC, as WeCom defines it): a wrong key is
    # caught by the padding check about 255 times in 256, and never yields the plaintext.
    wrong = decode_aes_key(base64.b64encode(bytes(range(1, 33))).decode()[:43])
    with pytest.raises((IllegalBufferError, DecryptAesError)):
        decrypt_media(wrong, sealed)
    for _ in range(8):
        other = decode_aes_key(base64.b64encode(os.urandom(32)).decode()[:43])
        with contextlib.suppress(IllegalBufferError, DecryptAesError):
            assert decrypt_media(other, sealed) != png
    with pytest.raises(DecryptAesError):
        decrypt_media(key, b"short")


# -- media/get against the emulator ----------------------------------------------------------------
@pytest.fixture(scope="module")
def emu():
    with EmulatorServer(EmulatorConfig(aibot_token="bot-token", aibot_aes_key=AES_KEY)) as server:
        yield server


@pytest.fixture
def client(emu):
    cfg = emu.state.config
    emu.state.clear_faults()
    return WeComClient(cfg.corp_id, cfg.secret, cfg.agent_id, api_base=emu.url, timeout=(2, 3))


def test_media_get_serves_the_samples(client):
    voice = client.get_media("emulator-voice", max_bytes=1 << 20, accept=("audio/",))
    assert voice.data.startswith(b"#!AMR\n") and voice.content_type == "audio/amr"
    assert voice.filename == "voice.amr"
    image = client.get_media("emulator-image", max_bytes=1 << 20, accept=("image/",))
    assert image.data.startswith(b"\x89PNG") and image.content_type == "image/png"
    pdf = client.get_media("emulator-file", max_bytes=1 << 20)
    assert pdf.data.startswith(b"%PDF-") and pdf.filename == "policy.pdf"


def test_media_get_refuses_too_large_and_the_wrong_type(client):
    with pytest.raises(MediaRejectedError) as too_large:
        client.get_media("emulator-file", max_bytes=100)
    assert too_large.value.too_large
    with pytest.raises(MediaRejectedError) as wrong:
        client.get_media("emulator-file", max_bytes=1 << 20, accept=("image/",))
    assert not wrong.value.too_large


def test_media_get_expired_id_is_40007(client, emu):
    media_id = requests.post(f"{emu.url}/_emulator/media", timeout=5, json={
        "data_b64": base64.b64encode(b"hello").decode(), "content_type": "text/plain",
        "filename": "a.txt"}).json()["media_id"]
    assert client.get_media(media_id, max_bytes=100).data == b"hello"
    requests.post(f"{emu.url}/_emulator/media/{media_id}/expire", timeout=5)
    with pytest.raises(InvalidMediaError) as expired:
        client.get_media(media_id, max_bytes=100)
    assert expired.value.errcode == 40007
    with pytest.raises(InvalidMediaError):
        client.get_media("never-issued", max_bytes=100)


def test_a_large_text_file_is_a_file_not_an_error(client, emu):
    text = ("员工手册 " * 20000).encode()
    media_id = requests.post(f"{emu.url}/_emulator/media", timeout=5, json={
        "data_b64": base64.b64encode(text).decode(), "content_type": "text/plain"}).json()["media_id"]
    assert client.get_media(media_id, max_bytes=1 << 20).data == text
    with pytest.raises(MediaRejectedError):
        client.get_media(media_id, max_bytes=1000)


def test_media_get_faults_are_transient_and_a_stale_token_is_refreshed(client, emu):
    requests.post(f"{emu.url}/_emulator/faults", json={"api": "media/get", "http_status": 503}, timeout=5)
    with pytest.raises(WeComTransientError):
        client.get_media("emulator-image", max_bytes=1 << 20)
    requests.post(f"{emu.url}/_emulator/faults", json={"api": "media/get", "errcode": -1}, timeout=5)
    with pytest.raises(WeComTransientError):
        client.get_media("emulator-image", max_bytes=1 << 20)
    client.get_media("emulator-image", max_bytes=1 << 20)
    requests.post(f"{emu.url}/_emulator/tokens/expire", json={}, timeout=5)
    assert client.get_media("emulator-image", max_bytes=1 << 20).data.startswith(b"\x89PNG")


def test_aibot_media_url_serves_encrypted_bytes(emu):
    sealed = requests.get(f"{emu.url}/_emulator/aibot/media/emulator-image", timeout=5).content
    assert decrypt_media(decode_aes_key(AES_KEY), sealed) == samples.png_image()


# -- the samples themselves ------------------------------------------------------------------------
def test_samples_are_real_media():
    from pypdf import PdfReader

    from worker.media.audio import find_decoder, to_wav

    text = PdfReader(io.BytesIO(samples.pdf_document(["Line (one)", "Line two"]))).pages[0].extract_text()
    assert "Line (one)" in text and "Line two" in text
    for clip in (samples.amr_clip(1.0), samples.handmade_amr(1.0)):
        wav = to_wav(clip, find_decoder())
        with wave.open(io.BytesIO(wav)) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
            assert 0.9 <= w.getnframes() / 16000 <= 1.2
