"""WeCom's API misbehaving (the emulator's fault queue): 5xx, timeouts, bad tokens, rate limits.

Transient faults are retried by the task with exponential backoff, a bounded number of times;
a send whose answer was lost (a timeout) may have been delivered, so the retry must not deliver
it again; what finally fails is recorded on the row and shown on the admin dashboard.
Complements tests/integration/test_worker_faults.py (502 twice, 42001 once).
"""

import pytest

from app import create_app
from app.admin.accounts import create_user
from app.services import Services
from tests.admin.conftest import login
from tests.faults.conftest import WECOM_DB
from tests.support.env import settings_from
from tests.support.stack import Stack, wait_for

MAX_RETRIES = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("wecom-faults"), db_kind="postgres", redis_db=WECOM_DB,
              extra_env={"TASK_MAX_RETRIES": str(MAX_RETRIES)}).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def users(stack):
    return iter([u["userid"] for u in stack.emu("GET", "directory")["users"]])


def send_calls(stack) -> int:
    return stack.emu("GET", "stats")["apis"].get("message/send", {}).get("calls", 0)


def row_of(stack, status: str):
    return wait_for(lambda: [r for r in stack.outbox_rows() if r["status"] == status][-1:],
                    timeout=60, what=f"a {status} row")[0]


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


def test_rate_limit_45009_is_retried_with_backoff(stack, users):
    user = next(users)
    stack.emu("POST", "faults", json={"api": "message/send", "errcode": 45009, "count": 2})
    stack.send(user, "限流")
    answered_once(stack, user, "限流")
    assert stack.outbox_rows()[-1]["attempts"] == 3
    log = stack.log("worker")
    assert "retry in 2s" in log and "retry in 4s" in log  # 2 ** attempt


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
    calls = send_calls(stack)
    stack.emu("POST", "faults", json={"api": "message/send", "http_status": 503, "count": 100})
    try:
        stack.send(user, "企业微信挂了")
        row = row_of(stack, "failed")
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
