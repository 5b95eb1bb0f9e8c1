"""The long connection's frames, heartbeat, backoff and lease (app/wecom/aibot_ws.py,
app/web/aibot_connection.py's Lease on a real Redis, DB 13)."""

import json
import random
import threading
import time
from types import SimpleNamespace

import pytest
import redis

from app.web.aibot_connection import Lease
from app.wecom import aibot_ws as ws
from tests.support.env import TEST_REDIS, redis_url


def test_frames_have_the_sdk_shape():
    sub = json.loads(ws.subscribe("bot-1", "s3cret").encode())
    assert sub["cmd"] == "aibot_subscribe" and sub["body"] == {"bot_id": "bot-1", "secret": "s3cret"}
    assert sub["headers"]["req_id"].startswith("aibot_subscribe_")
    ping = json.loads(ws.ping().encode())
    assert ping["cmd"] == "ping" and "body" not in ping and ping["headers"]["req_id"].startswith("ping_")
    reply = json.loads(ws.respond_stream("req-9", "s-1", "答：你好", True).encode())
    assert reply == {"cmd": "aibot_respond_msg", "headers": {"req_id": "req-9"},
                     "body": {"msgtype": "stream", "stream": {"id": "s-1", "finish": True, "content": "答：你好"}}}
    welcome = json.loads(ws.respond_welcome("req-e", "hi").encode())
    assert welcome["cmd"] == "aibot_respond_welcome_msg" and welcome["body"]["text"]["content"] == "hi"


def test_decode_round_trips_and_reads_acks():
    frame = ws.respond_stream("r", "s", "x", False)
    assert ws.decode(frame.encode()) == frame
    ack = ws.decode('{"headers": {"req_id": "ping_1_ab"}, "errcode": 0, "errmsg": "ok"}')
    assert ack.is_ack and ack.errcode == 0 and ack.cmd == ""
    callback = ws.decode(json.dumps({"cmd": "aibot_event_callback", "headers": {"req_id": "e"},
                                     "body": {"msgtype": "event", "event": {"eventtype": "enter_chat"}}}))
    assert not callback.is_ack and ws.event_type(callback) == "enter_chat"


@pytest.mark.parametrize("raw", [
    "not json", "[]", '{"cmd": "x"}', '{"cmd": "x", "headers": {"req_id": ""}}',
    '{"headers": {"req_id": "r"}}', '{"cmd": 3, "headers": {"req_id": "r"}}',
    '{"cmd": "x", "headers": {"req_id": "r"}, "body": []}',
    '{"headers": {"req_id": "r"}, "errcode": "0"}', '{"headers": {"req_id": "r"}, "errcode": true}',
    "x" * (ws.MAX_FRAME_BYTES + 1),
])
def test_decode_refuses_what_is_not_a_frame(raw):
    with pytest.raises(ws.FrameError):
        ws.decode(raw)


def test_heartbeat_is_due_every_interval_and_dead_after_two_misses():
    now = [0.0]
    hb = ws.Heartbeat(30, clock=lambda: now[0])
    assert not hb.due()
    now[0] = 30
    assert hb.due()
    hb.sent()
    assert not hb.due() and not hb.dead
    hb.acked()
    now[0] = 60
    hb.sent()
    now[0] = 90
    hb.sent()
    assert hb.dead  # two pings in a row unanswered
    hb.acked()
    assert not hb.dead


def test_backoff_grows_is_capped_jittered_and_resets():
    backoff = ws.Backoff(1.0, 30.0, rng=random.Random(7))
    delays = [backoff.next() for _ in range(12)]
    assert all(0.5 <= d <= 30.0 for d in delays)
    assert max(delays[:2]) <= 2.0 and backoff.ceiling() == 30.0
    assert len({round(d, 6) for d in delays}) == len(delays)  # jittered, not in step
    backoff.reset()
    assert backoff.ceiling() == 1.0 and backoff.next() <= 1.0


@pytest.fixture
def client():
    c = redis.Redis.from_url(redis_url(13))
    try:
        c.ping()
    except redis.RedisError as exc:  # a service that is down fails the test, never skips it
        pytest.fail(f"no Redis at {TEST_REDIS} (make services): {exc}", pytrace=False)
    c.flushdb()
    yield c
    c.flushdb()


def test_one_lease_holder_at_a_time(client):
    a, b = Lease(client, 2.0), Lease(client, 2.0)
    assert a.acquire() and not b.acquire()
    assert a.renew() and a.fresh()
    assert not b.renew()  # only the holder may renew
    b.release()  # nor release
    assert client.get(a.key) == a.token.encode()
    a.release()
    assert b.acquire() and not a.renew()


def test_a_dead_holders_lease_expires(client):
    a, b = Lease(client, 1.0), Lease(client, 1.0)
    assert a.acquire()
    client.pexpire(a.key, 50)  # as if a's renewals stopped a second ago
    time.sleep(0.1)
    assert b.acquire() and not a.renew()


class FakeWS:
    def __init__(self, incoming=()):
        self.sent, self.incoming = [], list(incoming)

    def send(self, raw):
        self.sent.append(json.loads(raw))

    def recv(self, timeout=None):
        if not self.incoming:
            raise TimeoutError
        return self.incoming.pop(0)


def session_for(client, ws_, monkeypatch, texts):
    """A Session over a fake socket whose streams say what ``texts`` (stream id -> list of
    (content, finish)) says, one refresh at a time."""
    from app.web import aibot_callback
    from app.web.aibot_connection import Pending, Session

    def refresh(stream_id, services):
        content, finish = texts[stream_id][0] if len(texts[stream_id]) == 1 else texts[stream_id].pop(0)
        return {"msgtype": "stream", "stream": {"id": stream_id, "content": content, "finish": finish}}

    monkeypatch.setattr(aibot_callback, "refresh", refresh)
    from app.aibot.pushes import Pushes
    from app.aibot.uploads import MediaPushes

    holder = SimpleNamespace(pending=Pending(client), pushes=Pushes(client), media=MediaPushes(client),
                             settings=SimpleNamespace(aibot_stream_ttl_s=60), services=None)
    return Session(holder, ws_, ws.Heartbeat(30))


def test_the_pump_sends_what_the_bot_writes_first_once_and_marks_it_when_acked(client, monkeypatch):
    fake = FakeWS()
    session = session_for(client, fake, monkeypatch, {})
    session.holder.pushes.add("alert:9:wangfang", "wangfang", "**预算** 80%")
    session.holder.pushes.add("alert:9:lina", "lina", "**预算** 80%")
    session.pump()
    session.pump()  # in flight: not sent twice
    frames = [ws.decode(json.dumps(raw)) for raw in fake.sent]
    assert [(f.cmd, f.body["chatid"], f.body["msgtype"]) for f in frames] == [
        (ws.SEND, "wangfang", "markdown"), (ws.SEND, "lina", "markdown")]
    session.handle(ws.ack(frames[0].req_id))
    session.handle(ws.ack(frames[1].req_id, 40058, "invalid chatid"))  # refused: dropped, not retried
    assert session.holder.pushes.waiting() == []
    assert not session.holder.pushes.add("alert:9:wangfang", "wangfang", "**预算** 80%")  # sent
    assert session.holder.pushes.add("alert:9:lina", "lina", "**预算** 80%")  # refused, not sent


def test_the_pump_sends_a_stream_when_it_changes_and_drops_it_once_the_finish_is_acked(client, monkeypatch):
    fake = FakeWS()
    texts = {"s1": [("", False), ("", False), ("答", False), ("答：好", True)]}
    session = session_for(client, fake, monkeypatch, texts)
    session.holder.pending.add("s1", "req-1", "m1")
    for _ in range(5):
        session.pump()
    assert [(f["body"]["stream"]["content"], f["body"]["stream"]["finish"]) for f in fake.sent] == [
        ("", False), ("答", False), ("答：好", True)]  # unchanged text not sent again; nothing after finish
    assert {f["headers"]["req_id"] for f in fake.sent} == {"req-1"}
    for _ in range(2):
        session.acked(ws.ack("req-1"))
    assert session.holder.pending.get("s1") is not None  # one frame still unacknowledged
    session.acked(ws.ack("req-1"))
    assert session.holder.pending.get("s1") is None and session.holder.pending.was_delivered("s1")


def test_a_new_session_sends_an_owed_streams_current_text_again(client, monkeypatch):
    texts = {"s2": [("半句", False)]}
    first = session_for(client, FakeWS(), monkeypatch, texts)
    first.holder.pending.add("s2", "req-2", "m2")
    first.pump()
    again = FakeWS()
    second = session_for(client, again, monkeypatch, texts)  # the next holder, after a crash
    second.pump()
    assert again.sent[0]["body"]["stream"] == {"id": "s2", "finish": False, "content": "半句"}


def test_heartbeat_death_and_a_refused_subscription_end_the_session(client, monkeypatch):
    from app.web.aibot_connection import ConnectionClosed

    refusing = FakeWS()
    session = session_for(client, refusing, monkeypatch, {})
    refusing.send = lambda raw: (FakeWS.send(refusing, raw), refusing.incoming.append(
        ws.ack(json.loads(raw)["headers"]["req_id"], 40001, "invalid secret").encode()))
    with pytest.raises(ConnectionClosed, match="refused errcode=40001"):
        session.subscribe("bot", "secret")
    now = [0.0]
    session = session_for(client, FakeWS(), monkeypatch, {})
    session.heartbeat = ws.Heartbeat(1, clock=lambda: now[0])
    session.holder.stopping = threading.Event()
    session.holder.keeper = SimpleNamespace(lost=threading.Event())
    session.holder.lease = SimpleNamespace(fresh=lambda: True)

    def tick(timeout=None):
        now[0] += 1  # a second per receive: pings go out, no ack ever comes
        raise TimeoutError

    session.ws.recv = tick
    with pytest.raises(ConnectionClosed, match="pings unanswered"):
        session.loop()
    assert [f["cmd"] for f in session.ws.sent] == ["ping", "ping"]


def test_a_blank_first_piece_of_a_stream_is_empty_not_an_error():
    from worker.delivery.stream_writer import STREAM_CONTENT_LIMIT, fit

    assert fit("\n") == "" and fit("  \n\n") == "" and fit("") == ""
    assert fit("\n答") == "答"
    assert len(fit("好" * STREAM_CONTENT_LIMIT).encode()) <= STREAM_CONTENT_LIMIT


def test_a_lease_not_renewed_in_time_closes_the_connection(client, monkeypatch):
    from app.web.aibot_connection import ConnectionClosed, Lease

    now = [0.0]
    lease = Lease(client, 5.0, clock=lambda: now[0])
    assert lease.acquire() and lease.fresh()
    now[0] = 3.9
    assert lease.fresh()
    now[0] = 4.1  # 80 % of its life without a renewal: give the connection up before it expires
    assert not lease.fresh()
    session = session_for(client, FakeWS(), monkeypatch, {})
    session.holder.stopping = threading.Event()
    session.holder.keeper = SimpleNamespace(lost=threading.Event())
    session.holder.lease = lease
    with pytest.raises(ConnectionClosed, match="lease lost"):
        session.loop()
    assert lease.renew() and lease.fresh()  # still ours in Redis: a renewal makes it fresh again


def test_contending_replicas_never_hold_the_lease_at_once(client):
    """Five replicas grab, hold a moment, drop and grab again for two seconds: from the grant
    (after SET NX answered) to the release (before DEL is asked), their holds never overlap."""
    holds, lock = [], threading.Lock()

    def replica():
        lease = Lease(client, 1.0)
        end = time.monotonic() + 2
        while time.monotonic() < end:
            if lease.acquire():
                granted = time.monotonic()
                time.sleep(random.uniform(0.002, 0.02))
                assert lease.renew()
                releasing = time.monotonic()
                lease.release()
                with lock:
                    holds.append((granted, releasing))
            time.sleep(random.uniform(0, 0.005))

    threads = [threading.Thread(target=replica) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    holds.sort()
    assert len(holds) > 10
    for (_, released), (next_granted, _) in zip(holds, holds[1:], strict=False):
        assert next_granted >= released


# -- voice, images, files and mixed messages over the connection ----------------------------------
def _media_frame(kind: str, req_id: str, **content) -> ws.Frame:
    return ws.Frame(ws.MSG_CALLBACK, req_id, {
        "msgid": f"m-{req_id}", "aibotid": "aib-1", "chattype": "single", "from": {"userid": "zhangwei"},
        "msgtype": kind, **content})


@pytest.mark.parametrize(("kind", "content", "expect"), [
    ("voice", {"voice": {"content": "报销流程是什么"}}, {"content": "报销流程是什么"}),
    ("image", {"image": {"url": "https://x/i", "aeskey": "K1"}},
     {"content": "", "image_urls": ("https://x/i",), "media_keys": ("K1",)}),
    ("file", {"file": {"url": "https://x/f", "aeskey": "F1"}},
     {"content": "", "file_url": "https://x/f", "file_key": "F1"}),
    ("mixed", {"mixed": {"msg_item": [{"msgtype": "text", "text": {"content": "有什么不同"}},
                                      {"msgtype": "image", "image": {"url": "https://x/1", "aeskey": "A"}},
                                      {"msgtype": "image", "image": {"url": "https://x/2"}}]}},
     {"content": "有什么不同", "image_urls": ("https://x/1", "https://x/2"), "media_keys": ("A", "")}),
])
def test_media_messages_go_the_callbacks_way_and_are_answered_once(client, monkeypatch, kind, content, expect):
    """Each kind the callback asks is asked over the connection too (``askable`` and ``submit``,
    the aeskeys carried to the worker), never the text-only notice; its stream is answered once."""
    from app.outbox import rows
    from app.web import aibot_callback

    fake = FakeWS()
    texts = {}
    session = session_for(client, fake, monkeypatch, texts)
    session.holder.services = SimpleNamespace(settings=SimpleNamespace(aibot_name="小星"))
    asked = []

    def submit(services, message, request_id, fingerprint_, stream_id):
        asked.append(message)
        texts[stream_id] = [("", False), ("答：好", True)]
        return rows.Accepted(1, True, stream_id)

    monkeypatch.setattr(aibot_callback, "submit", submit)
    session.handle(_media_frame(kind, "req-m", **content))
    session.pump()
    session.pump()
    assert len(asked) == 1 and asked[0].msg_type == kind
    for name, value in expect.items():
        assert getattr(asked[0], name) == value, name
    frames = [f["body"]["stream"] for f in fake.sent]
    assert [(f["content"], f["finish"]) for f in frames] == [("", False), ("答：好", True)]
    assert aibot_callback.UNSUPPORTED_NOTICE not in str(fake.sent)


def test_a_mixed_message_with_nothing_in_it_gets_the_notice_once(client, monkeypatch):
    from app.web import aibot_callback

    fake = FakeWS()
    session = session_for(client, fake, monkeypatch, {})
    session.holder.services = SimpleNamespace(settings=SimpleNamespace(aibot_name="小星"))
    monkeypatch.setattr(aibot_callback, "submit", lambda *a: pytest.fail("nothing to ask"))
    session.handle(_media_frame("mixed", "req-e", mixed={"msg_item": [
        {"msgtype": "text", "text": {"content": "  "}}]}))
    assert [(f["headers"]["req_id"], f["body"]["stream"]["finish"]) for f in fake.sent] == [("req-e", True)]
    assert fake.sent[0]["body"]["stream"]["content"] == aibot_callback.UNSUPPORTED_NOTICE


def test_the_emulator_sends_every_kind_over_the_connection_each_image_and_file_with_its_own_key():
    """No EncodingAESKey (a bot on the long connection only): each image and file comes with its
    own aeskey, its URL serves the bytes sealed with it; each kind is answered once."""
    import base64

    import requests
    from websockets.sync.client import connect

    from app.wecom.crypto import decrypt_media
    from emulator import media as samples
    from emulator.config import EmulatorConfig
    from emulator.server import EmulatorServer

    cfg = EmulatorConfig(aibot_bot_id="aib-1", aibot_secret="s3cret", aibot_ws_port=0)
    with EmulatorServer(cfg) as emu, connect(emu.ws_url) as conn:
        conn.send(ws.subscribe("aib-1", "s3cret").encode())
        assert ws.decode(conn.recv(timeout=5)).errcode == 0
        sealed = {"image": samples.png_image(), "file": samples.pdf_document(samples.SAMPLE_PDF_LINES)}
        for spec in ({"msg_type": "voice", "content": "报销流程是什么"}, {"msg_type": "image"},
                     {"msg_type": "file"}, {"msg_type": "mixed", "content": "有什么不同",
                                            "media_ids": ["emulator-image", "emulator-image"]}):
            sent = requests.post(f"{emu.url}/_emulator/aibot/send",
                                 json={"mode": "ws", "from_user": "zhangwei", **spec}, timeout=5)
            assert sent.status_code == 200, sent.text
            frame = ws.decode(conn.recv(timeout=5))
            kind = spec["msg_type"]
            assert frame.cmd == ws.MSG_CALLBACK and frame.body["msgtype"] == kind
            items = ([frame.body[kind]] if kind in sealed else
                     [i["image"] for i in frame.body["mixed"]["msg_item"] if i["msgtype"] == "image"]
                     if kind == "mixed" else [])
            for item in items:
                data = requests.get(item["url"], timeout=5).content
                key = base64.b64decode(item["aeskey"])
                assert decrypt_media(key, data) == sealed.get(kind, sealed["image"])
            assert len({i["aeskey"] for i in items}) == len(items)  # one key each
            conn.send(ws.respond_stream(frame.req_id, f"s-{kind}", f"答:{kind}", True).encode())
            assert ws.decode(conn.recv(timeout=5)).errcode == 0
            done = emu.long_connection.conversation(sent.json()["delivery_id"])
            assert done["status"] == "finished" and done["final"] == f"答:{kind}"
        inbound = [(m["msg_type"], m["content"]) for m in emu.state.inbound if m["channel"] == "aibot_ws"]
        assert inbound == [("voice", "报销流程是什么"), ("image", "[image]"), ("file", "[file]"),
                           ("mixed", "有什么不同 [image] [image]")]


# -- the AI bot's 👍/👎 (app.feedback.ratings) over the connection -----------------------------------------
def test_a_questions_first_frame_carries_the_feedback_id_and_a_rating_goes_to_the_outbox(client, monkeypatch):
    from app.feedback import ratings as feedback
    from app.outbox import rows
    from app.security.blind_index import BlindIndex
    from app.web import aibot_callback

    fake = FakeWS()
    texts = {}
    session = session_for(client, fake, monkeypatch, texts)
    index = BlindIndex([b"k" * 32])
    session.holder.services = SimpleNamespace(
        settings=SimpleNamespace(aibot_name="小星", feedback_cards=True), blind_index=index)
    ids = iter(range(40, 50))

    def submit(services, message, request_id, fingerprint_, stream_id):
        texts[stream_id] = [("", False), ("答", False), ("答：好", True)]
        return rows.Accepted(next(ids), True, stream_id)

    monkeypatch.setattr(aibot_callback, "submit", submit)
    session.handle(_media_frame("text", "req-q", text={"content": "年假有几天"}))
    session.handle(_media_frame("text", "req-c", text={"content": "/help"}))
    for _ in range(3):
        session.pump()
    by_req = {}
    for f in fake.sent:
        by_req.setdefault(f["headers"]["req_id"], []).append(f["body"]["stream"])
    question, command = by_req["req-q"], by_req["req-c"]
    assert question[0]["feedback"] == {"id": feedback.feedback_id(index, 40)}
    assert [("feedback" in s) for s in question] == [True, False, False]  # the first frame only
    assert not any("feedback" in s for s in command)  # a command's reply: nothing to rate

    accepted = []
    monkeypatch.setattr(aibot_callback, "accept_feedback",
                        lambda services, message, request_id, fp: accepted.append(message))
    event = {"msgid": "ev-9", "aibotid": "aib-1", "chattype": "single", "from": {"userid": "zhangwei"},
             "msgtype": "event", "event": {"eventtype": "feedback_event", "feedback_event": {
                 "id": question[0]["feedback"]["id"], "type": 2, "content": "不对",
                 "inaccurate_reason_list": [3]}}}
    session.handle(ws.Frame(ws.EVENT_CALLBACK, "req-ev", event))
    [rated] = accepted
    assert (rated.msg_id, rated.feedback_type, rated.feedback_reasons, rated.content) == ("ev-9", 2, (3,), "不对")
    session.handle(ws.Frame(ws.EVENT_CALLBACK, "req-bad", {"msgtype": "event", "msgid": [1],
                                                           "event": {"eventtype": "feedback_event"}}))
    assert len(accepted) == 1 and len(fake.sent) == len(question) + len(command)  # no reply to events


def test_the_emulator_lets_a_user_rate_only_a_reply_that_carried_a_feedback_id():
    import requests
    from websockets.sync.client import connect

    from emulator.config import EmulatorConfig
    from emulator.server import EmulatorServer

    cfg = EmulatorConfig(aibot_bot_id="aib-1", aibot_secret="s3cret", aibot_ws_port=0)
    with EmulatorServer(cfg) as emu, connect(emu.ws_url) as conn:
        conn.send(ws.subscribe("aib-1", "s3cret").encode())
        assert ws.decode(conn.recv(timeout=5)).errcode == 0

        def turn(first_feedback, later_feedback=None) -> int:
            sent = requests.post(f"{emu.url}/_emulator/aibot/send",
                                 json={"mode": "ws", "from_user": "zhangwei", "content": "年假?"}, timeout=5)
            frame = ws.decode(conn.recv(timeout=5))
            for content, finish, fid in (("…", False, first_feedback), ("答", True, later_feedback)):
                conn.send(ws.respond_stream(frame.req_id, f"s-{frame.req_id}", content, finish, fid).encode())
                assert ws.decode(conn.recv(timeout=5)).errcode == 0
            return sent.json()["delivery_id"]

        def rate(delivery_id, **body):
            return requests.post(f"{emu.url}/_emulator/aibot/feedback",
                                 json={"delivery_id": delivery_id, **body}, timeout=5)

        rated = turn("fb-1-abc")
        answer = rate(rated, type=2, reasons=[1, 3], content="不完整")
        assert answer.status_code == 200, answer.text
        event = ws.decode(conn.recv(timeout=5))
        assert event.cmd == ws.EVENT_CALLBACK and ws.event_type(event) == "feedback_event"
        assert event.body["from"] == {"userid": "zhangwei"} and event.body["msgid"] == answer.json()["msg_id"]
        assert event.body["event"]["feedback_event"] == {"id": "fb-1-abc", "type": 2, "content": "不完整",
                                                         "inaccurate_reason_list": [1, 3]}
        assert rate(rated, type=3).status_code == 200
        assert ws.event_type(ws.decode(conn.recv(timeout=5))) == "feedback_event"
        assert rate(rated, type=1, from_user="lina", msg_id="same").status_code == 200  # another rater
        assert ws.decode(conn.recv(timeout=5)).body["from"] == {"userid": "lina"}
        for bad in ({"type": 4}, {"type": 1, "reasons": [1]}, {"type": 2, "reasons": [5]},
                    {"type": 1, "from_user": "nobody"}):
            assert rate(rated, **bad).status_code == 400, bad
        unrated = turn(None)  # WeCom shows no thumbs under a reply without feedback.id
        assert rate(unrated, type=1).status_code == 409
        late = turn(None, "fb-2-abc")  # feedback on a later frame: WeCom reads the first only
        assert rate(late, type=1).status_code == 409
        assert rate(999, type=1).status_code == 404
        conversation = emu.long_connection.conversation(rated)
        assert [r["type"] for r in conversation["ratings"]] == [2, 3, 1]
        assert emu.state.snapshot_stats()["aibot_ws"]["late_feedback"] == 1


def test_the_emulator_shows_what_the_bot_writes_first_and_refuses_text():
    from websockets.sync.client import connect

    from emulator.config import EmulatorConfig
    from emulator.server import EmulatorServer

    cfg = EmulatorConfig(aibot_bot_id="aib-1", aibot_secret="s3cret", aibot_ws_port=0)
    with EmulatorServer(cfg) as emu, connect(emu.ws_url) as conn:
        conn.send(ws.subscribe("aib-1", "s3cret").encode())
        assert ws.decode(conn.recv(timeout=5)).errcode == 0
        push = ws.send_markdown("WangFang", "**部门预算提醒** 80%")
        assert push.cmd == ws.SEND and push.req_id.startswith("aibot_send_msg_")
        conn.send(push.encode())
        ack = ws.decode(conn.recv(timeout=5))
        assert (ack.req_id, ack.errcode) == (push.req_id, 0)
        text = ws.Frame(ws.SEND, ws.new_req_id(ws.SEND), {"chatid": "wangfang", "msgtype": "text",
                                                          "text": {"content": "hi"}})
        conn.send(text.encode())
        assert ws.decode(conn.recv(timeout=5)).errcode == 40008
        stranger = ws.send_markdown("ghost", "hi")
        conn.send(stranger.encode())
        assert ws.decode(conn.recv(timeout=5)).errcode != 0
        shown = [(m["touser"], m["msgtype"], m["content"]) for m in emu.state.messages
                 if m["source"] == "aibot_ws_send"]
        assert shown == [("wangfang", "markdown", "**部门预算提醒** 80%")]
