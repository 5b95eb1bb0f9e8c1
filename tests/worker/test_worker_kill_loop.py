"""The Celery worker SIGKILLed in the middle of a generation, 20 times in a row.

Each round sends a message, waits until the (slow) model server has started generating, kills the
worker's whole process group and starts a new one. Tasks die with their worker; the outbox row's
lease expires and the sweeper publishes it again, or Redis hands the unacknowledged task back.
At the end every message must have been delivered to its user exactly once, as the emulator
counts them.
"""

import signal

import pytest

from tests.support.faults import KILL_DB, answered_once, wait_answered
from tests.support.stack import Stack, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ROUNDS = 20


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("kill-loop"), db_kind="postgres", redis_db=KILL_DB,
              model_delay_s=1.0, worker_concurrency=4,
              extra_env={"CLAIM_LEASE_S": "4", "SWEEP_QUEUED_AFTER_S": "3"}).start()
    yield s
    s.stop()


def test_twenty_sigkills_mid_generation_every_message_answered_exactly_once(stack):
    users = [u["userid"] for u in stack.emu("GET", "directory")["users"]]
    expected: dict[str, list[str]] = {}
    killed_mid_generation = 0
    for round_ in range(ROUNDS):
        user = users[round_ % len(users)]
        text = f"第{round_}轮 kill test"
        expected.setdefault(user, []).append(text)
        calls = stack.model.calls
        stack.send(user, text, wait=True)
        wait_for(lambda calls=calls: stack.model.calls > calls, timeout=60,
                 what=f"a generation to start in round {round_}")
        in_flight = stack.model.in_flight
        stack.kill("worker", signal.SIGKILL)
        killed_mid_generation += in_flight > 0
        stack.start_worker()
        wait_for(stack.worker_ready, 60, what="the restarted worker")
    assert killed_mid_generation >= ROUNDS // 2, "most kills must land inside a generation"

    wait_answered(stack, expected, timeout=180)
    # Let any late redelivery of a killed task (it would be a duplicate) run before counting.
    wait_for(lambda: all(r["status"] == "answered" for r in stack.outbox_rows()), timeout=60,
             what="every row answered")
    assert answered_once(stack, expected) == {}
    delivered = stack.emu("GET", "stats")["apis"]["message/send"]["delivered"]
    assert delivered == ROUNDS
