"""WeComClient against a small fake WeCom (a real Flask app on 127.0.0.1) and real Redis DB 15."""

import logging
import threading
import time
import uuid
from collections import Counter, deque

import pytest
import redis
from flask import Flask, jsonify, request
from werkzeug.serving import make_server

from app.wecom import exceptions as exc
from app.wecom.client import WeComClient, redact
from tests.support.env import redis_url
from tests.support.stack import free_port

SECRET = "s3cr3t-app-secret"


class FakeWeCom:
    """Counts calls, issues tokens, answers what a test queued, records what was sent."""

    def __init__(self):
        self.app = Flask("fake-wecom")
        self.lock = threading.Lock()
        self.reset()
        self.app.add_url_rule("/cgi-bin/gettoken", view_func=self.gettoken)
        self.app.add_url_rule("/cgi-bin/message/send", view_func=self.message_send, methods=["POST"])
        self.app.add_url_rule("/cgi-bin/user/get", view_func=self.user_get)

    def reset(self):
        self.calls = Counter()
        self.sent = []
        self.tokens = set()
        self.injected = deque()  # answers for the next API calls (not gettoken)
        self.gettoken_answers = deque()
        self.gettoken_delay = 0.0
        self.expires_in = 7200

    def gettoken(self):
        with self.lock:
            self.calls["gettoken"] += 1
            number = self.calls["gettoken"]
        time.sleep(self.gettoken_delay)
        if self.gettoken_answers:
            return jsonify(self.gettoken_answers.popleft())
        if request.args.get("corpsecret") != SECRET:
            return jsonify(errcode=40001, errmsg="invalid credential")
        token = f"tok-{number}-{uuid.uuid4().hex[:6]}"
        self.tokens.add(token)
        return jsonify(errcode=0, errmsg="ok", access_token=token, expires_in=self.expires_in)

    def _api(self, name, ok):
        self.calls[name] += 1
        if self.injected:
            answer = self.injected.popleft()
            if isinstance(answer, int):
                return "upstream trouble", answer
            if isinstance(answer, tuple):  # (HTTP status, headers)
                return "slow down", answer[0], answer[1]
            if isinstance(answer, float):
                time.sleep(answer)
                return ok()
            return jsonify(answer)
        if request.args.get("access_token") not in self.tokens:
            return jsonify(errcode=40014, errmsg="invalid access_token")
        return ok()

    def message_send(self):
        sent = self.sent  # a send answered late (after a client timeout) stays with its own test

        def ok():
            sent.append(request.get_json())
            return jsonify(errcode=0, errmsg="ok", invaliduser="", msgid=f"m{len(sent)}")
        return self._api("send", ok)

    def user_get(self):
        def ok():
            return jsonify(errcode=0, errmsg="ok", userid=request.args["userid"], name="张三",
                           department=[1, 2], main_department=1)
        return self._api("user_get", ok)


@pytest.fixture(scope="module")
def server():
    fake = FakeWeCom()
    httpd = make_server("127.0.0.1", 0, fake.app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    fake.base = f"http://127.0.0.1:{httpd.server_port}"
    yield fake
    httpd.shutdown()
    thread.join(5)


@pytest.fixture
def wecom(server):
    server.reset()
    return server


@pytest.fixture
def r():
    client = redis.Redis.from_url(redis_url(15))
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def make_client(wecom, r=None, corp_id="ww-test", **kwargs):
    kwargs.setdefault("timeout", (1, 2))
    return WeComClient(corp_id, SECRET, 1000002, api_base=wecom.base, redis=r, **kwargs)


# --- access token --------------------------------------------------------------------------


def test_token_is_cached_in_redis_with_early_expiry(wecom, r):
    client = make_client(wecom, r)
    token = client.access_token()
    assert client.access_token() == token
    assert wecom.calls["gettoken"] == 1
    assert r.get(client.token_key).decode() == token
    assert 6890 <= r.ttl(client.token_key) <= 6900  # 7200 - 300 margin
    assert SECRET not in client.token_key and "ww-test" in client.token_key


def test_two_clients_share_one_fetch(wecom, r):
    first, second = make_client(wecom, r), make_client(wecom, r)
    assert first.access_token() == second.access_token()
    assert wecom.calls["gettoken"] == 1


def test_expired_token_is_fetched_again(wecom, r):
    client = make_client(wecom, r)
    old = client.access_token()
    r.pexpire(client.token_key, 1)
    time.sleep(0.01)
    new = client.access_token()
    assert new != old and wecom.calls["gettoken"] == 2


def test_short_lived_token_is_kept_for_half_its_life(wecom, r):
    wecom.expires_in = 100
    client = make_client(wecom, r)
    client.access_token()
    assert 48 <= r.ttl(client.token_key) <= 50


def test_concurrent_refreshers_fetch_once(wecom, r):
    wecom.gettoken_delay = 0.3
    clients = [make_client(wecom, redis.Redis.from_url(redis_url(15))) for _ in range(8)]
    results, barrier = [], threading.Barrier(len(clients))

    def run(client):
        barrier.wait()
        results.append(client.access_token())

    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == 8 and len(set(results)) == 1
    assert wecom.calls["gettoken"] == 1
    assert r.get(clients[0].lock_key) is None  # released by its owner


def test_force_refresh_reuses_a_token_another_process_already_renewed(wecom, r):
    first, second = make_client(wecom, r), make_client(wecom, r)
    stale = first.access_token()
    renewed = second.access_token(force_refresh=True)
    assert renewed != stale and wecom.calls["gettoken"] == 2
    # first still holds ``stale``, which WeCom rejects: the renewed one in Redis is taken as is.
    assert first._refresh(rejected=stale) == renewed
    assert wecom.calls["gettoken"] == 2


def test_stuck_lock_holder_is_not_waited_for_forever_and_its_lock_is_not_released(wecom, r):
    client = make_client(wecom, r)
    client.lock_wait = 0.2
    r.set(client.lock_key, "another-process", px=10_000)
    started = time.monotonic()
    assert client.access_token()
    assert time.monotonic() - started < 2
    assert r.get(client.lock_key) == b"another-process"


def test_redis_down_falls_back_to_a_process_local_token(wecom, caplog):
    dead = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2, retry=None)
    client = make_client(wecom, dead)
    with caplog.at_level(logging.DEBUG, logger="app.wecom"):
        started = time.monotonic()
        token = client.access_token()
        assert client.access_token() == token
        assert client.send("zhangsan", "text", "hi")["errcode"] == 0
        assert time.monotonic() - started < 3  # one failed connect, then Redis is skipped a while
    assert wecom.calls["gettoken"] == 1
    ours = "\n".join(rec.getMessage() for rec in caplog.records if rec.name.startswith("app."))
    assert "Redis unreachable" in ours
    assert token not in ours and SECRET not in ours


def test_redis_is_tried_again_after_the_pause(wecom, r):
    client = make_client(wecom, r)
    client._redis_down_until = time.monotonic() + 60
    local = client.access_token()
    assert r.get(client.token_key) is None
    client._redis_down_until = 0.0
    shared = client.access_token()  # Redis is empty: fetched once more and now shared
    assert r.get(client.token_key).decode() == shared
    assert wecom.calls["gettoken"] == 2 and local


def test_gettoken_error_raises_without_leaking_the_secret(wecom, r, caplog):
    wecom.gettoken_answers.append({"errcode": 40091, "errmsg": "secret is invalid"})
    client = make_client(wecom, r)
    with caplog.at_level(logging.DEBUG, logger="app.wecom"), pytest.raises(exc.WeComAPIError) as info:
        client.access_token()
    assert info.value.errcode == 40091
    ours = "\n".join(rec.getMessage() for rec in caplog.records if rec.name.startswith("app."))
    assert SECRET not in str(info.value) and SECRET not in ours and SECRET not in repr(client)
    assert r.get(client.lock_key) is None


# --- message/send --------------------------------------------------------------------------


def test_send_text_body(wecom, r):
    answer = make_client(wecom, r).send("ZhangSan", "text", "你好")
    assert answer["msgid"] == "m1"
    assert wecom.sent == [{"touser": "ZhangSan", "msgtype": "text", "agentid": 1000002,
                           "text": {"content": "你好"}, "safe": 0}]


def test_send_markdown_with_duplicate_check(wecom, r):
    make_client(wecom, r).send("u", "markdown", "**hi**", duplicate_check_interval=600)
    body = wecom.sent[0]
    assert body["markdown"] == {"content": "**hi**"}
    assert (body["enable_duplicate_check"], body["duplicate_check_interval"]) == (1, 600)


@pytest.mark.parametrize(("msgtype", "content"), [
    ("text", "字" * 683),  # 2049 bytes
    ("markdown", "a" * 4097),
    ("text", "  \n"),
    ("news", "x"),
])
def test_send_refuses_bad_content_before_any_call(wecom, r, msgtype, content):
    with pytest.raises(ValueError):
        make_client(wecom, r).send("u", msgtype, content)
    assert wecom.calls["send"] == 0


def test_send_refuses_broadcast_and_bad_interval(wecom, r):
    client = make_client(wecom, r)
    with pytest.raises(ValueError):
        client.send("@all", "text", "hi")
    with pytest.raises(ValueError):
        client.send("u", "text", "hi", duplicate_check_interval=5 * 3600)
    assert wecom.calls["send"] == 0


@pytest.mark.parametrize("code", [40001, 40014, 42001, 42007, 42009])
def test_token_error_refreshes_and_retries_once(wecom, r, code):
    client = make_client(wecom, r)
    client.access_token()
    wecom.injected.append({"errcode": code, "errmsg": "access_token expired"})
    assert client.send("u", "text", "hi")["errcode"] == 0
    assert (wecom.calls["gettoken"], wecom.calls["send"]) == (2, 2)


def test_token_error_twice_is_not_retried_again(wecom, r):
    client = make_client(wecom, r)
    wecom.injected.extend([{"errcode": 42001, "errmsg": "expired"}] * 2)
    with pytest.raises(exc.WeComAPIError) as info:
        client.send("u", "text", "hi")
    assert info.value.errcode == 42001
    assert wecom.calls["send"] == 2


def test_untrusted_ip(wecom, r):
    wecom.injected.append({"errcode": 60020, "errmsg": "not allow to access from your ip, hint: "
                           "[1655799424626], from ip: 101.43.7.8, more info at https://open."
                           "work.weixin.qq.com/devtool/query?e=60020"})
    with pytest.raises(exc.UntrustedIPError) as info:
        make_client(wecom, r).send("u", "text", "hi")
    assert info.value.ip == "101.43.7.8"
    assert "101.43.7.8" in str(info.value) and "trusted IP" in str(info.value)
    assert wecom.calls["send"] == 1


def test_no_valid_receiver(wecom, r):
    wecom.injected.append({"errcode": 81013, "errmsg": "user & party & tag all invalid"})
    with pytest.raises(exc.NoValidReceiverError):
        make_client(wecom, r).send("ghost", "text", "hi")


@pytest.mark.parametrize(("field", "error"), [("invaliduser", exc.InvalidUserError),
                                              ("unlicenseduser", exc.UnlicensedUserError)])
def test_receiver_dropped_in_an_ok_answer(wecom, r, field, error):
    wecom.injected.append({"errcode": 0, "errmsg": "ok", field: "zhangsan"})
    with pytest.raises(error) as info:
        make_client(wecom, r).send("ZhangSan", "text", "hi")
    assert info.value.users == ["ZhangSan"]


@pytest.mark.parametrize("answer", [{"errcode": -1, "errmsg": "system busy"},
                                    {"errcode": 45009, "errmsg": "api freq out of limit"}, 502, 503])
def test_transient_failures_are_raised_not_retried(wecom, r, answer):
    wecom.injected.append(answer)
    with pytest.raises(exc.WeComTransientError) as info:
        make_client(wecom, r).send("u", "text", "hi")
    assert wecom.calls["send"] == 1
    # 45009 is WeCom's frequency limit: the caller must wait for its window, not retry at once.
    assert info.value.rate_limited == (answer == {"errcode": 45009, "errmsg": "api freq out of limit"})
    assert info.value.retry_after is None  # WeCom names no wait


@pytest.mark.parametrize(("headers", "retry_after"), [({"Retry-After": "7"}, 7.0), ({}, None),
                                                      ({"Retry-After": "Wed, 21 Oct 2026"}, None)])
def test_http_429_is_rate_limited_with_the_servers_wait(wecom, r, headers, retry_after):
    wecom.injected.append((429, headers))
    with pytest.raises(exc.WeComTransientError) as info:
        make_client(wecom, r).send("u", "text", "hi")
    assert info.value.rate_limited and info.value.retry_after == retry_after


def test_timeout_is_transient(wecom, r):
    client = make_client(wecom, r, timeout=(1, 0.2))
    client.access_token()
    wecom.injected.append(0.5)
    with pytest.raises(exc.WeComTransientError) as info:
        client.send("u", "text", "hi")
    assert info.value.errcode is None
    assert wecom.calls["send"] == 1


def test_connection_error_is_transient_and_hides_the_token(r):
    client = WeComClient("ww-dead", SECRET, 1, api_base=f"http://127.0.0.1:{free_port()}",
                         redis=r, timeout=(0.5, 0.5))
    r.set(client.token_key, "TOKEN-VALUE-123")
    with pytest.raises(exc.WeComTransientError) as info:
        client.send("u", "text", "hi")
    text = str(info.value)
    assert "TOKEN-VALUE-123" not in text and info.value.__cause__ is None
    assert info.value.__suppress_context__


def test_other_errcodes_are_plain_api_errors(wecom, r):
    wecom.injected.append({"errcode": 48002, "errmsg": "api forbidden"})
    with pytest.raises(exc.WeComAPIError) as info:
        make_client(wecom, r).send("u", "text", "hi")
    assert type(info.value) is exc.WeComAPIError and info.value.errcode == 48002
    assert info.value.response["errmsg"] == "api forbidden"


def test_send_text_splits_in_order(wecom, r):
    paragraphs = [f"第{i}段。" + "内容" * 300 for i in range(3)]  # ~1.8 KB each
    answers = make_client(wecom, r).send_text("u", "\n\n".join(paragraphs))
    assert len(answers) == 3
    assert [body["text"]["content"] for body in wecom.sent] == paragraphs


def test_send_markdown_uses_the_larger_limit(wecom, r):
    answers = make_client(wecom, r).send_markdown("u", "a " * 3000)
    assert len(answers) == 2
    assert all(len(b["markdown"]["content"].encode()) <= 4096 for b in wecom.sent)


def test_partial_send_reports_progress_and_resumes(wecom, r):
    client = make_client(wecom, r)
    client.access_token()
    text = "\n\n".join(["x" * 2000, "y" * 2000, "z" * 2000])
    wecom.injected.extend([
        {"errcode": 0, "errmsg": "ok", "msgid": "a"},
        {"errcode": 45009, "errmsg": "freq limit"},
    ])
    with pytest.raises(exc.WeComTransientError) as info:
        client.send_text("u", text)
    assert info.value.chunks_sent == 1
    answers = client.send_text("u", text, first_chunk=info.value.chunks_sent)
    assert len(answers) == 2
    assert [b["text"]["content"][0] for b in wecom.sent] == ["y", "z"]


def test_send_text_of_nothing_is_refused(wecom, r):
    with pytest.raises(ValueError):
        make_client(wecom, r).send_text("u", " \n ")


# --- user/get ------------------------------------------------------------------------------


def test_get_user(wecom, r):
    user = make_client(wecom, r).get_user("zhangsan")
    assert (user["name"], user["department"], user["main_department"]) == ("张三", [1, 2], 1)


def test_get_user_refreshes_token_once(wecom, r):
    client = make_client(wecom, r)
    client.access_token()
    wecom.injected.append({"errcode": 40014, "errmsg": "invalid access_token"})
    assert client.get_user("zhangsan")["userid"] == "zhangsan"
    assert wecom.calls["gettoken"] == 2


def test_get_user_unknown(wecom, r):
    wecom.injected.append({"errcode": 60111, "errmsg": "userid not found"})
    with pytest.raises(exc.InvalidUserError):
        make_client(wecom, r).get_user("ghost")


def test_redact():
    assert redact("GET /x?access_token=abc&corpsecret=def&y=1") == (
        "GET /x?access_token=***&corpsecret=***&y=1")
