"""A department budget's alerts reach the department's head, through the whole stack: gunicorn,
Celery, the long-connection service and the emulator (WeCom, recording every delivery).

李娜 (lina, 算法组, department 3) asks until her department's monthly budget is spent. Its head,
王芳 (wangfang, ``is_leader_in_dept`` there; ``department/get`` answers her as
``department_leader``), gets each threshold's alert (50/80/100 %) once as an app message and once
from the AI bot (``aibot_send_msg`` over the long connection). Lina gets one notice card when
the budget first refuses her, then a one-line reminder. A worker restarted, and an alert whose
worker died while sending it, send nothing twice.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy import select, update

from app.accounting import redeliver, set_budget, set_price
from app.db import Database, utcnow
from app.models import BudgetAlert
from app.services import Services
from tests.support.env import settings_from
from tests.support.stack import Stack, wait_for

pytestmark = pytest.mark.integration
HEAD, ASKER = "wangfang", "lina"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp(f"head-alerts-{request.param}"), db_kind=request.param,
              redis_db=6, extra_env={"AIBOT_BOT_ID": "aib-emulator", "AIBOT_SECRET": "aibot-long-connection-secret-x9",
                                     "AIBOT_WS_HEARTBEAT_S": "1", "AIBOT_WS_LEASE_S": "2"}).start()
    s.start_connection()
    wait_for(lambda: s.emu("GET", "aibot/ws")["connected"], 30, 0.2, "the long connection")
    yield s
    s.stop()


def to(stack, user: str, source: str) -> list[dict]:
    return [m for m in stack.emu("GET", "messages", params={"touser": user})["messages"]
            if m.get("source") == source]


def head_alerts(stack, source: str) -> list[str]:
    return [m.get("content") or "" for m in to(stack, HEAD, source)
            if "部门预算提醒" in (m.get("content") or "")]


def test_the_head_hears_each_threshold_once_and_the_employee_gets_one_card(stack):
    db = Database(stack.db.url)
    try:
        with db.transaction() as session:
            set_price(session, "fake-glm", 2000, 2000, 2000)  # CNY per million tokens: ~1 a question
            set_budget(session, "department", "3", "month", "2.5", action="block",
                       thresholds="50,80,100")
        for n in range(12):
            before = len(stack.replies(ASKER))
            stack.send(ASKER, f"第{n}个问题：报销流程是什么？")
            wait_for(lambda before=before: len(stack.replies(ASKER)) > before, 60, 0.2, "an answer")
            if sum("see the notice above" in r for r in stack.replies(ASKER)) >= 2:
                break
        replies = stack.replies(ASKER)
        cards = [r for r in replies if "Budget used up" in r]
        reminders = [r for r in replies if "see the notice above" in r]
        assert len(cards) == 1 and len(reminders) == 2
        assert replies.index(cards[0]) < replies.index(reminders[0])
        card = next(m for m in to(stack, ASKER, "message/send") if "Budget used up" in (m.get("content") or ""))
        assert card["msgtype"] == "markdown" and "部门" in card["content"] and "2.50 CNY" in card["content"]

        wait_for(lambda: len(head_alerts(stack, "message/send")) == 3, 30, 0.2, "the head's app messages")
        wait_for(lambda: len(head_alerts(stack, "aibot_ws_send")) == 3, 30, 0.2, "the head's bot messages")
        texts = head_alerts(stack, "message/send")
        assert ["50%" in texts[0], "80%" in texts[1], "used up" in texts[2]] == [True, True, True]
        assert all("算法组" in t for t in texts)
        pushes = to(stack, HEAD, "aibot_ws_send")
        assert all(p["msgtype"] == "markdown" for p in pushes)
        assert all(p["payload"]["chatid"] == HEAD for p in pushes)
        assert head_alerts(stack, "message/send") and not to(stack, ASKER, "aibot_ws_send")  # heads only
        with db.session() as session:
            alerts = session.execute(select(BudgetAlert.threshold, BudgetAlert.delivered)
                                     .order_by(BudgetAlert.threshold)).all()
        assert [(t, set(d.split(","))) for t, d in alerts] == [
            (50, {"heads", "aibot"}), (80, {"heads", "aibot"}), (100, {"heads", "aibot"})]

        # A worker restarted: nothing is raised or sent again.
        stack.kill("worker")
        stack.start_worker()
        wait_for(stack.worker_ready, 60, 0.5, "the worker back")
        services = Services(settings_from(stack.env), db)
        assert redeliver(db, services.alert_sender, "CNY") == 0

        # A worker that died while sending the 80 % alert (claimed, never marked): the hourly
        # maintenance sends it again; WeCom's duplicate check and the bot's sent mark keep the
        # head from reading it twice.
        with db.transaction() as session:
            session.execute(update(BudgetAlert).where(BudgetAlert.threshold == 80).values(
                delivered="sending", created_at=utcnow().replace(microsecond=0) - _minutes(10)))
        suppressed = stack.emu("GET", "stats")["apis"]["message/send"].get("duplicates_suppressed", 0)
        assert redeliver(db, services.alert_sender, "CNY") == 1
        assert stack.emu("GET", "stats")["apis"]["message/send"]["duplicates_suppressed"] == suppressed + 1
        assert len(head_alerts(stack, "message/send")) == 3
        assert len(head_alerts(stack, "aibot_ws_send")) == 3
        with db.session() as session:
            assert set(session.scalar(select(BudgetAlert.delivered).where(BudgetAlert.threshold == 80))
                       .split(",")) == {"heads"}  # the bot had it already: not queued again
        spent = Decimal(texts[2].rsplit("\n", 1)[1].split(" / ")[0])
        assert spent >= Decimal("2.5")
    finally:
        db.dispose()


def _minutes(n: int):
    from datetime import timedelta

    return timedelta(minutes=n)
