"""The intake server (app/web/intake_server.py) SIGKILLed while employees are sending.

gunicorn runs the server as its dirty worker and starts a new one; meanwhile the web processes
write in-process (app/intake/client.py), so no callback is refused for it, and a message whose
batch died with the server is written again by its thread (a duplicate of nothing, or of a row
the server had committed). At the end every message has been answered exactly once, and the
restarted server took its share of the later traffic.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.support.faults import KILL_DB, answered_once, wait_answered
from tests.support.stack import Stack, wait_for

pytestmark = pytest.mark.faults

MESSAGES = 60


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _intake_server_pid(stack: Stack) -> int:
    """gunicorn's master -> its dirty arbiter -> the dirty worker (the web workers have no children)."""
    grandchildren = [g for child in _children(stack.procs["web"].pid) for g in _children(child)]
    assert len(grandchildren) == 1, grandchildren
    return grandchildren[0]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("intake-kill"), redis_db=KILL_DB, model_delay_s=0.05,
              extra_env={"SWEEP_QUEUED_AFTER_S": "3", "WEB_WORKERS": "3"}).start()
    yield s
    s.stop()


def test_a_killed_intake_server_loses_nothing_and_is_started_again(stack):
    wait_for(lambda: "intake server listening" in stack.log("web"), 30, what="the intake server")
    first = _intake_server_pid(stack)
    users = [u["userid"] for u in stack.emu("GET", "directory")["users"]][:6]
    expected = {user: [f"进件 {user} {i}" for i in range(MESSAGES // len(users))] for user in users}

    def employee(user: str) -> None:  # one employee's messages, one after another, for ~8 s
        for text in expected[user]:
            stack.send(user, text, wait=True)
            time.sleep(0.8)

    senders = [threading.Thread(target=employee, args=(user,)) for user in users]
    for sender in senders:
        sender.start()
    time.sleep(1.0)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: stack.log("web").count("intake server listening") >= 2, 60,
             what="gunicorn to start a new intake server")
    second = _intake_server_pid(stack)
    assert second != first
    for sender in senders:
        sender.join(120)
        assert not sender.is_alive()

    wait_answered(stack, expected, timeout=120)
    assert answered_once(stack, expected) == {}
    assert len(stack.outbox_rows()) == MESSAGES
    codes = [a["status_code"] for a in stack.emu("GET", "callbacks")["attempts"]]
    assert set(codes) == {200}, codes  # the web processes wrote in-process while it was away
    stack.stop_processes()  # the restarted server says what it wrote as it stops
    stopped = [line for line in stack.log("web").splitlines() if "intake server stopping" in line]
    assert len(stopped) == 1 and " 0 messages" not in stopped[0], stopped
