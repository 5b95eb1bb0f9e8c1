"""Who hears a department budget's alert (app/accounting/heads.py) and the AI bot's push queue
(app/aibot/pushes.py), against the emulator's directory and real Redis."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from app.accounting import DepartmentHeads, RaisedAlert
from app.accounting.heads import department_heads
from app.aibot.pushes import Pushes
from app.wecom.client import WeComClient
from emulator import EmulatorConfig, EmulatorServer
from tests.support.env import make_env


@pytest.fixture
def emulator():
    env = make_env()
    config = EmulatorConfig(corp_id=env["WECOM_CORP_ID"], secret=env["WECOM_SECRET"],
                            agent_id=int(env["WECOM_AGENT_ID"]), token=env["WECOM_TOKEN"],
                            aes_key=env["WECOM_AES_KEY"])
    with EmulatorServer(config) as server:
        yield server, WeComClient(env["WECOM_CORP_ID"], env["WECOM_SECRET"], int(env["WECOM_AGENT_ID"]),
                                  api_base=server.url)


def alert(scope="department", value="3", threshold=80) -> RaisedAlert:
    return RaisedAlert(41, 7, scope, value, "month", datetime(2026, 12, 1, tzinfo=UTC), threshold,
                       Decimal("8.5"), Decimal("10"), "CNY", "block")


def test_the_heads_are_the_departments_own_or_the_nearest_above(emulator):
    server, wecom = emulator
    assert department_heads(wecom, "3") == (["wangfang"], "算法组")
    server.state.directory.update_user("wangfang", departments=[4])  # 算法组 has no head now
    assert department_heads(wecom, "3") == (["zhangwei"], "研发中心")  # its parent's
    server.state.directory.update_user("zhangwei", departments=[4])
    assert department_heads(wecom, "3") == ([], "")  # never the root's (the whole company)
    assert department_heads(wecom, "not-a-department") == ([], "")


def test_a_department_alert_goes_to_its_heads_by_app_message_and_bot(emulator, redis_client):
    server, wecom = emulator
    route = DepartmentHeads(wecom, Pushes(redis_client))
    assert route(alert()) == ["heads", "aibot"]
    sent = [(m["touser"], m["content"]) for m in server.state.messages]
    assert len(sent) == 1 and sent[0][0] == "wangfang"
    assert "算法组" in sent[0][1] and "80%" in sent[0][1] and "8.50 / 10.00 CNY" in sent[0][1]
    (push,) = Pushes(redis_client).waiting()
    assert push.chatid == "wangfang" and push.key == "alert:41:wangfang" and "**" in push.content
    assert route(alert()) == ["heads"]  # again (a redelivery): queued once only
    assert len(server.state.messages) == 1  # WeCom's duplicate check dropped the second
    assert route(alert(scope="user", value="u-hash")) == []  # not a department's
    assert route(alert(scope="global", value="")) == []


def test_a_push_acknowledged_is_never_queued_again_and_old_ones_expire(redis_client):
    pushes = Pushes(redis_client)
    assert pushes.add("alert:1:wangfang", "wangfang", "**a**")
    assert not pushes.add("alert:1:wangfang", "wangfang", "**a**")
    pushes.sent("alert:1:wangfang")
    assert pushes.waiting() == [] and not pushes.add("alert:1:wangfang", "wangfang", "**a**")
    assert pushes.add("alert:2:wangfang", "wangfang", "**b**")
    assert pushes.waiting(now=datetime.now(UTC).timestamp() + 2 * 86400) == []  # nobody took it
    assert redis_client.hlen("aibot:ws:pushes") == 0
