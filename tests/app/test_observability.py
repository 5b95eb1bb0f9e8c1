"""Metrics, JSON logs and the per-user rate limit, through the real stack (gunicorn + Celery)."""

import json
import re
from decimal import Decimal

import pytest
import requests

from tests.support.stack import Stack, free_port, select_rows, wait_for

pytestmark = pytest.mark.integration
LIMIT = 3
TOKEN = "metrics-token-for-the-observability-test"
SENTINEL_TEXT = "SENTINEL-机密-8842 the launch code"


@pytest.fixture(scope="module")
def obs(tmp_path_factory):
    port = free_port()
    s = Stack(tmp_path_factory.mktemp("stack-observe"), db_kind="sqlite", redis_db=5, extra_env={
        "WECOM_USER_RATE_LIMIT": f"{LIMIT}/min", "METRICS_PORT": str(port),
        "METRICS_TOKEN": TOKEN, "LOG_FORMAT": "json"})
    s.metrics_port = port
    s.start()
    from app.accounting import set_budget
    from app.db import Database

    db = Database(s.db.url)
    with db.transaction() as session:
        set_budget(session, "global", "", "month", Decimal("500"))
    users = [u["userid"] for u in s.emu("GET", "directory")["users"]]
    s.sentinel_user, s.flood_user, s.calm_user = users[-1], users[-2], users[-3]
    yield s
    s.stop()


def scrape(url: str, **kwargs) -> dict[str, float]:
    resp = requests.get(url, timeout=10, **kwargs)
    resp.raise_for_status()
    values = {}
    for line in resp.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def web_metrics(stack, **kwargs):
    return scrape(f"http://127.0.0.1:{stack.web_port}/metrics", **kwargs)


def worker_metrics(stack):
    return scrape(f"http://127.0.0.1:{stack.metrics_port}/metrics")


def rows_of(stack) -> list[dict]:
    return select_rows(stack.db.url,
                "SELECT id, user_hash, status, failure_reason, request_id, msg_type "
                "FROM inbound_messages ORDER BY id")


def json_lines(log: str) -> list[dict]:
    out = []
    for line in log.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_a_message_moves_the_counters_on_both_endpoints(obs):
    before_web = web_metrics(obs)
    obs.send(obs.sentinel_user, SENTINEL_TEXT, wait=True)
    wait_for(lambda: len(obs.replies(obs.sentinel_user)) == 1, 30, what="the answer")
    key = 'wecom_bot_callbacks_total{outcome="accepted",reason=""}'
    # Two gunicorn workers: whichever answers the scrape adds up both workers' files.
    scrapes = [web_metrics(obs) for _ in range(4)]
    assert {m[key] for m in scrapes} == {before_web.get(key, 0) + 1}
    after_web = scrapes[-1]
    assert not any(k.startswith("python_gc_") for k in after_web)  # multiprocess mode, not one process
    assert after_web['wecom_bot_queue_depth{queue="chat"}'] >= 0
    budget = [k for k in after_web if k.startswith("wecom_bot_budget_limit{")]
    assert len(budget) == 1 and 'scope="global"' in budget[0] and after_web[budget[0]] == 500
    assert any(k.startswith("wecom_bot_budget_spent{") for k in after_web)

    worker = wait_for(lambda: (m := worker_metrics(obs)).get(
        'wecom_bot_messages_finished_total{status="answered"}') and m, 15, what="worker metrics")
    assert worker['wecom_bot_messages_finished_total{status="answered"}'] >= 1
    assert worker['wecom_bot_message_latency_seconds_count{status="answered"}'] >= 1
    assert worker['wecom_bot_generated_tokens_total{model="fake-glm"}'] > 0
    assert worker['wecom_bot_generation_seconds_total{model="fake-glm"}'] > 0


def test_metrics_need_loopback_or_the_token(obs):
    url = f"http://127.0.0.1:{obs.web_port}/metrics"
    assert requests.get(url, headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401
    ok = requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert ok.status_code == 200 and "wecom_bot_callbacks_total" in ok.text


def test_logs_are_json_carry_the_request_id_and_no_secrets_or_text(obs):
    # A rejected callback with our request id: the web log line carries it.
    resp = requests.post(obs.callback_url, params={"msg_signature": "x", "timestamp": "1",
                                                   "nonce": "n"},
                         headers={"X-Request-ID": "obs-rid-42"}, data=b"<xml/>", timeout=5)
    assert resp.status_code == 403 and resp.headers["X-Request-Id"] == "obs-rid-42"
    web = wait_for(lambda: [e for e in json_lines(obs.log("web")) if e.get("request_id") == "obs-rid-42"],
                   10, what="the web log line")
    assert {"ts", "level", "logger", "msg", "request_id"} <= set(web[0])
    assert web[0]["logger"] == "app.web.callback" and "rejected" in web[0]["msg"]

    # The accepted message's id (stored with it) follows it into the worker's log.
    obs.send(obs.sentinel_user, SENTINEL_TEXT + " again", wait=True)
    wait_for(lambda: len(obs.replies(obs.sentinel_user)) >= 2, 30, what="the second answer")
    request_id = rows_of(obs)[-1]["request_id"]
    assert request_id
    finished = wait_for(lambda: [e for e in json_lines(obs.log("worker"))
                                 if e.get("request_id") == request_id
                                 and "message finished" in e["msg"]], 10, what="worker log line")
    assert finished[0]["logger"] == "worker.processor"
    # Celery's own line for the task comes after the processor let go of the row's id: it has
    # the id only because it travelled in the task headers.
    assert [e for e in json_lines(obs.log("worker"))
            if e["logger"] == "celery.app.trace" and e.get("request_id") == request_id]

    logs = obs.log("web") + obs.log("worker") + obs.log("beat")
    assert "SENTINEL" not in logs and "launch code" not in logs and obs.sentinel_user not in logs
    secrets = [obs.env[name] for name in ("WECOM_SECRET", "WECOM_TOKEN", "WECOM_AES_KEY",
                                          "SECRET_KEY", "BLIND_INDEX_KEY")]
    secrets += [part.partition(":")[2] for part in obs.env["DATA_KEYS"].split(",")]
    assert not [s for s in secrets if s and s in logs]
    assert TOKEN not in logs
    worker_lines = [line for line in obs.log("worker").splitlines() if line.startswith("{")]
    assert worker_lines and all(json.loads(line)["level"] for line in worker_lines)


def test_one_employee_over_the_limit_gets_one_notice_others_are_unaffected(obs):
    flood, calm = obs.flood_user, obs.calm_user
    calls_before = obs.model.calls
    for i in range(LIMIT + 2):
        obs.send(flood, f"问题 {i + 1}", wait=True)
    obs.send(calm, "你好", wait=True)
    wait_for(lambda: len(obs.replies(flood)) >= LIMIT + 1 and len(obs.replies(calm)) >= 1, 30,
             what="answers and the notice")
    wait_for(lambda: all(r["status"] not in ("queued", "processing") for r in rows_of(obs)), 30,
             what="every row final")

    got = obs.replies(flood)
    assert len(got) == LIMIT + 1
    assert all(reply.startswith("答复#") for reply in got[:LIMIT])
    assert "您发送得太快了" in got[-1] and "too fast" in got[-1]
    assert len(obs.replies(calm)) == 1 and obs.replies(calm)[0].startswith("答复#")
    assert obs.model.calls - calls_before == LIMIT + 1  # no model run for the limited ones

    statuses = [r["status"] for r in rows_of(obs)[-(LIMIT + 3):]]
    assert statuses.count("rate_limited") == 2 and statuses.count("answered") == LIMIT + 1
    limited = [r for r in rows_of(obs) if r["status"] == "rate_limited"]
    assert all(re.match(r"rate limited", r["failure_reason"]) for r in limited)

    worker = worker_metrics(obs)
    assert worker['wecom_bot_user_rate_limited_total{notified="true"}'] == 1
    assert worker['wecom_bot_user_rate_limited_total{notified="false"}'] == 1
    assert worker['wecom_bot_messages_finished_total{status="rate_limited"}'] == 2
