"""Images and files sent back over the AI bot's long connection (app/aibot/uploads): a holder of
the connection (``app.web.aibot_connection.Holder``, on a thread) against the emulator's WebSocket
end, real Redis. The bytes travel in 512 KiB chunks and arrive whole (the emulator checks the
MD5), the member gets an ``aibot_send_msg`` with the ``media_id``, each key is sent once, and a
refused upload is dropped, not retried for ever."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from app.aibot.uploads import MediaPushes, Upload, UploadFailed
from app.aibot.uploads.queue import MEDIA_KEY
from app.services import Services
from app.web.aibot_connection import Holder
from app.wecom import aibot_ws
from emulator import EmulatorConfig, EmulatorServer
from tests.support.env import make_env, settings_from
from tests.support.stack import wait_for

BOT, SECRET = "aib-uploads", "aibot-long-connection-secret-for-uploads"


@pytest.fixture
def emulator():
    env = make_env()
    config = EmulatorConfig(corp_id=env["WECOM_CORP_ID"], secret=env["WECOM_SECRET"],
                            agent_id=int(env["WECOM_AGENT_ID"]), token=env["WECOM_TOKEN"],
                            aes_key=env["WECOM_AES_KEY"], aibot_bot_id=BOT, aibot_secret=SECRET)
    with EmulatorServer(config) as server:
        yield server


@pytest.fixture
def holder(emulator, redis_client):
    settings = settings_from(make_env(AIBOT_BOT_ID=BOT, AIBOT_SECRET=SECRET, AIBOT_WS_URL=emulator.ws_url,
                                      REDIS_URL=_url(redis_client), AIBOT_WS_LEASE_S="2"))
    running = Holder(Services(settings))
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    wait_for(lambda: emulator.long_connection.current is not None, 20, 0.05, "the subscription")
    yield running
    running.stopping.set()
    thread.join(10)


def _url(client) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


def sent_media(emulator, kind: str) -> list[dict]:
    return [m for m in emulator.state.messages if m.get("source") == "aibot_ws_send" and m["msgtype"] == kind]


def test_a_file_goes_up_in_chunks_and_to_the_member_once(emulator, holder, redis_client):
    data = os.urandom(aibot_ws.UPLOAD_CHUNK_BYTES * 2 + 1234)  # three chunks
    media = MediaPushes(redis_client)
    assert media.add("answer-7:report", "zhangwei", "file", "报销制度.pdf", data)
    (message,) = wait_for(lambda: sent_media(emulator, "file"), 20, 0.05, "the file message")
    media_id = message["payload"]["file"]["media_id"]
    stored = emulator.long_connection.uploads.media[media_id]
    assert stored["data"] == data and stored["filename"] == "报销制度.pdf" and stored["type"] == "file"
    assert message["touser"] == "zhangwei"
    stats = emulator.state.stats["aibot_ws"]
    assert stats["upload_media_chunk_ok"] == 3 and stats["upload_media_finish_ok"] == 1
    wait_for(lambda: not redis_client.hlen(MEDIA_KEY), 10, 0.05, "the entry to be settled")
    assert not media.add("answer-7:report", "zhangwei", "file", "报销制度.pdf", data)  # sent already
    png = b"\x89PNG\r\n\x1a\n" + os.urandom(3000)
    assert media.add("answer-8:chart", "lina", "image", "chart.png", png)
    (image,) = wait_for(lambda: sent_media(emulator, "image"), 20, 0.05, "the image message")
    assert emulator.long_connection.uploads.media[image["payload"]["image"]["media_id"]]["data"] == png
    assert len(sent_media(emulator, "file")) == 1


def test_a_refused_send_is_dropped_not_retried(emulator, holder, redis_client):
    media = MediaPushes(redis_client)
    assert media.add("to-nobody", "not-a-member", "file", "a.txt", b"hello world")
    wait_for(lambda: emulator.state.stats["aibot_ws"].get("send_refused"), 20, 0.05, "the refusal")
    wait_for(lambda: not redis_client.hlen(MEDIA_KEY), 10, 0.05, "the entry to be dropped")
    assert emulator.state.stats["aibot_ws"]["upload_media_finish_ok"] == 1
    assert not sent_media(emulator, "file")


def test_what_wecom_would_refuse_is_refused_when_queued(redis_client):
    media = MediaPushes(redis_client)
    for kind, name, data in (("voice", "a.amr", b"123456"), ("file", "a.txt", b"1234"),
                             ("image", "big.png", b"x" * (10 * 1024 * 1024 + 1)),
                             ("file", "../etc/passwd", b"123456"), ("file", "", b"123456")):
        with pytest.raises(ValueError):
            media.add("k", "zhangwei", kind, name, data)
    assert not redis_client.hlen(MEDIA_KEY)


def test_the_upload_steps_follow_the_acks():
    data = os.urandom(aibot_ws.UPLOAD_CHUNK_BYTES + 10)
    upload = Upload("k", "lina", "file", "x.bin", data)
    init = upload.start()
    assert init.cmd == aibot_ws.UPLOAD_INIT and init.body["total_chunks"] == 2
    assert init.body["md5"] == hashlib.md5(data).hexdigest()  # noqa: S324
    first = upload.on_ack(aibot_ws.Frame("", init.req_id, {"upload_id": "u1"}, 0))
    assert first.body["chunk_index"] == 0 and first.body["upload_id"] == "u1"
    second = upload.on_ack(aibot_ws.ack(first.req_id))
    finish = upload.on_ack(aibot_ws.ack(second.req_id))
    assert finish.cmd == aibot_ws.UPLOAD_FINISH
    send = upload.on_ack(aibot_ws.Frame("", finish.req_id, {"media_id": "m1"}, 0))
    assert send.body == {"chatid": "lina", "chat_type": 1, "msgtype": "file", "file": {"media_id": "m1"}}
    assert upload.on_ack(aibot_ws.ack(send.req_id)) is None and upload.done
    broken = Upload("k", "lina", "image", "x.png", b"123456")
    broken.start()
    with pytest.raises(UploadFailed, match="init"):
        broken.on_ack(aibot_ws.Frame("", "r", {}, 0))
    refused = Upload("k", "lina", "image", "x.png", b"123456")
    refused.start()
    with pytest.raises(UploadFailed, match="40058"):
        refused.on_ack(aibot_ws.ack("r", 40058, "invalid type"))
