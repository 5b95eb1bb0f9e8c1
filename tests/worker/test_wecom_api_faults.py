"""WeCom's API misbehaving (the emulator's fault queue): 5xx, timeouts, bad tokens, rate limits.

Transient faults are retried by the task with exponential backoff, a bounded number of times
(45009, WeCom's frequency limit, waits for its window: WECOM_RATE_LIMIT_RETRY_S, then doubled);
a send whose answer was lost (a timeout) may have been delivered, so the retry must not deliver
it again; what finally fails is recorded on the row and shown on the admin dashboard.
Complements tests/worker/test_worker_faults.py (502 twice, 42001 once).
"""

import json
import re
from datetime import datetime

import pytest

from app.services import Services
from app.web.admin.accounts import create_user
from app.web.factory import create_app
from tests.app.web.admin.conftest import login
from tests.support.env import settings_from
from tests.support.stack import Stack, wait_for

pytestmark = pytest.mark.faults

MAX_RETRIES = 3
# 45009's first wait (WECOM_RATE_LIMIT_RETRY_S, 60 s in production), short for the test but
# doubled past SWEEP_QUEUED_AFTER_S + SWEEP_INTERVAL_S (4 + 2 s), so an early sweep would show.
RATE_LIMIT_BASE_S = 4


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    s = Stack(tmp_path_factory.mktemp("wecom-faults"), db_kind="postgres",
              redis_url=redis_server.url(0),
              extra_env={"TASK_MAX_RETRIES": str(MAX_RETRIES),
                         "WECOM_RATE_LIMIT_RETRY_S": str(RATE_LIMIT_BASE_S)}).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def users(stack):
    return iter([u["userid"] for u in stack.emu("GET", "directory")["users"]])


def send_calls(stack) -> int:
    return stack.emu("GET", "stats")["apis"].get("message/send", {}).get("calls", 0)


def delivered_count(stack) -> int:
    return stack.emu("GET", "stats")["apis"].get("message/send", {}).get("delivered", 0)


def row_of(stack, status: str, after_id: int = 0):
    """The newest row in ``status`` that is newer than ``after_id``, once there is one."""
    return wait_for(lambda: [r for r in stack.outbox_rows()
                             if r["status"] == status and r["id"] > after_id][-1:],
                    timeout=60, what=f"a {status} row")[0]


def last_id(stack) -> int:
    return max((r["id"] for r in stack.outbox_rows()), default=0)


def answered_once(stack, user, text, timeout=60):
    wait_for(lambda: stack.replies(user), timeout=timeout, interval=0.3, what="the answer")
    wait_for(lambda: stack.outbox_rows()[-1]["status"] == "answered", timeout=30, what="answered row")
    assert stack.replies(user) == [f"答复#1: {text}"]


def test_timeout_after_delivery_is_retried_without_a_second_delivery(stack, users):
    """The client gives up after its 10 s read timeout; WeCom still delivers (a delay-only fault)."""
    user = next(users)
    stack.emu("POST", "faults", json={"api": "message/send", "delay": 11})
    stack.send(user, "超时了吗")
    answered_once(stack, user, "超时了吗", timeout=90)
    assert stack.outbox_rows()[-1]["attempts"] == 2
    assert stack.emu("GET", "stats")["apis"]["message/send"].get("duplicates_suppressed") == 1


def rate_limit_retries(stack, message_id: int) -> list[tuple[datetime, float]]:
    """(when, seconds) of each "retry in" the worker logged for the message's rate limit."""
    found = []
    for line in stack.log("worker").splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        match = re.match(r"transient failure \(WeCom rate limit\), retry in ([\d.]+)s "
                         rf"message_id={message_id} ", entry["msg"])
        if match:
            found.append((datetime.fromisoformat(entry["ts"]), float(match.group(1))))
    return found


def attempt_times(stack, message_id: int) -> list[datetime]:
    """When each attempt at the message ended: its rate-limit refusals, then its end."""
    ends = [when for when, _ in rate_limit_retries(stack, message_id)]
    for line in stack.log("worker").splitlines():
        if line.startswith("{") and (f"message finished message_id={message_id} " in line
                                     or f"message failed message_id={message_id} " in line):
            ends.append(datetime.fromisoformat(json.loads(line)["ts"]))
            break
    return ends


def assert_waited(stack, message_id: int, base: float) -> None:
    """Each retry waited WeCom's window (base, then doubled), and no attempt came earlier:
    the waits are longer than SWEEP_QUEUED_AFTER_S, so the sweeper must have kept off too."""
    retries = rate_limit_retries(stack, message_id)
    assert [round(wait / base) for _, wait in retries] == [2 ** i for i in range(len(retries))]
    assert all(base * 2 ** i <= wait <= base * 2 ** i * 1.1 for i, (_, wait) in enumerate(retries))
    ends = attempt_times(stack, message_id)
    assert len(ends) == len(retries) + 1
    for (when, wait), following in zip(retries, ends[1:], strict=True):
        assert (following - when).total_seconds() >= wait - 0.1


def test_rate_limit_45009_waits_for_wecoms_window_and_sends_once(stack, users):
    user = next(users)
    calls, delivered = send_calls(stack), delivered_count(stack)
    stack.emu("POST", "faults", json={"api": "message/send", "errcode": 45009, "count": 2})
    stack.send(user, "限流")
    answered_once(stack, user, "限流", timeout=90)
    row = stack.outbox_rows()[-1]
    assert row["attempts"] == 3
    assert send_calls(stack) - calls == 3  # one call per attempt, no hot loop
    assert delivered_count(stack) - delivered == 1
    assert_waited(stack, row["id"], RATE_LIMIT_BASE_S)


def test_invalid_token_40014_is_refreshed_once(stack, users):
    user = next(users)
    tokens = stack.emu("GET", "stats")["apis"]["gettoken"]["calls"]
    stack.emu("POST", "faults", json={"api": "message/send", "errcode": 40014})
    stack.send(user, "token 无效")
    answered_once(stack, user, "token 无效")
    assert stack.emu("GET", "stats")["apis"]["gettoken"]["calls"] == tokens + 1
    assert stack.outbox_rows()[-1]["attempts"] == 1  # the client's own refresh-and-retry


def test_wecom_down_gives_up_after_bounded_retries_and_shows_on_the_dashboard(stack, users):
    user = next(users)
    calls, after = send_calls(stack), last_id(stack)
    stack.emu("POST", "faults", json={"api": "message/send", "http_status": 503, "count": 100})
    try:
        stack.send(user, "企业微信挂了")
        row = row_of(stack, "failed", after)
    finally:
        stack.emu("DELETE", "faults")
    # MAX_RETRIES sends, one failure notice attempt; nothing reached the user
    assert send_calls(stack) - calls == MAX_RETRIES + 1
    assert stack.replies(user) == []
    assert row["attempts"] == MAX_RETRIES
    assert row["failure_reason"].startswith(f"gave up after {MAX_RETRIES} attempts: wecom:")
    assert "HTTP 503" in row["failure_reason"]

    services = Services(settings_from({**stack.env, "SESSION_COOKIE_SECURE": "false"}))
    with services.db.transaction() as session:
        create_user(session, "ops", "admin", "correct horse battery")
    client = create_app(services=services).test_client()
    assert login(client, "ops").status_code == 302
    page = client.get("/admin/dashboard").get_data(as_text=True)
    panel = page[page.index('id="delivery-failures"'):page.index("Top users")]
    assert 'id="failures-total">1<' in panel
    assert row["failure_reason"] in panel


def test_rate_limit_45009_that_persists_is_recorded_as_failed_after_the_bound(stack, users):
    """After the dashboard test, which counts exactly one failure."""
    user = next(users)
    calls, after = send_calls(stack), last_id(stack)
    stack.emu("POST", "faults", json={"api": "message/send", "errcode": 45009, "count": 100})
    try:
        stack.send(user, "一直限流")
        row = row_of(stack, "failed", after)
    finally:
        stack.emu("DELETE", "faults")
    assert row["attempts"] == MAX_RETRIES
    assert row["failure_reason"].startswith(
        f"gave up after {MAX_RETRIES} attempts: wecom: WeCom API error 45009")
    assert send_calls(stack) - calls == MAX_RETRIES + 1  # and the failure notice, refused too
    assert stack.replies(user) == []
    assert_waited(stack, row["id"], RATE_LIMIT_BASE_S)
