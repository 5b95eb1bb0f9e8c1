"""Faults on the worker side: a worker killed mid-generation, WeCom API errors."""

import signal
import time

import pytest

from tests.support.stack import Stack, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory):
    """Generation takes 1.5 s, so a worker can be killed in the middle of one."""
    s = Stack(tmp_path_factory.mktemp("faults"), db_kind="sqlite", redis_db=10, model_delay_s=1.5).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def users(slow_stack):
    return [u["userid"] for u in slow_stack.emu("GET", "directory")["users"]]


def test_worker_killed_mid_generation_every_message_answered_once(slow_stack, users):
    stack = slow_stack
    targets = users[:4]
    before = {u: len(stack.replies(u)) for u in targets}
    calls = stack.model.calls
    for user in targets:
        stack.send(user, f"{user} 被中断的问题", wait=True)
    wait_for(lambda: stack.model.calls > calls, timeout=20, what="a generation to start")
    stack.kill("worker", signal.SIGKILL)
    assert all(len(stack.replies(u)) == before[u] for u in targets[1:]), "killed too late to prove anything"
    stack.start_worker()
    wait_for(lambda: all(len(stack.replies(u)) > before[u] for u in targets), timeout=90, interval=0.5,
             what="every message answered after the restart")
    time.sleep(3)
    for user in targets:
        got = stack.replies(user)[before[user]:]
        assert got == [f"答复#1: {user} 被中断的问题"], got


def test_expired_token_is_refreshed_and_the_answer_sent_once(slow_stack, users):
    stack = slow_stack
    user = users[5]
    stack.emu("POST", "faults", json={"api": "message/send", "errcode": 42001})
    stack.send(user, "token 过期了吗")
    wait_for(lambda: len(stack.replies(user)) == 1, timeout=30, what="the answer")
    time.sleep(1)
    assert stack.replies(user) == ["答复#1: token 过期了吗"]


def test_wecom_5xx_is_retried_with_backoff_without_duplicates(slow_stack, users):
    stack = slow_stack
    user = users[6]
    stack.emu("POST", "faults", json={"api": "message/send", "http_status": 502, "count": 2})
    stack.send(user, "服务器错误")
    wait_for(lambda: len(stack.replies(user)) == 1, timeout=60, what="the answer after retries")
    time.sleep(2)
    assert stack.replies(user) == ["答复#1: 服务器错误"]


def test_model_server_down_ends_in_failed_with_a_polite_notice(slow_stack, users):
    stack = slow_stack
    user = users[7]
    stack.model.fail_next = 1000  # every call fails: retries are bounded, then the user is told
    try:
        stack.send(user, "模型挂了")
        wait_for(lambda: len(stack.replies(user)) == 1, timeout=120, interval=0.5, what="the notice")
        assert "稍后再试" in stack.replies(user)[0]
        wait_for(lambda: any(r["status"] == "failed" and "gave up" in (r["failure_reason"] or "")
                             for r in stack.outbox_rows()), timeout=10, what="the failed row")
    finally:
        stack.model.fail_next = 0
