"""The Celery worker under scripts/supervisor.py (as ``make run`` runs it), during traffic:
Redis restarted, then the worker SIGKILLed.

The Redis restart must cost no restart at all: the worker reconnects in-process
(worker/broker_fixes.py). The kill is the supervisor's job: it starts the worker again after its
backoff, logged. Redis is a private server (tests/support/servers.py) that keeps nothing on
disk, so the restart loses every queued task and the sweeper re-publishes the rows. At the end
every accepted message has been delivered exactly once, as the emulator counts deliveries.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest

from scripts.supervisor import Program, RestartPolicy, Supervisor
from tests.support.faults import answered_once, wait_answered
from tests.support.stack import BIN, ROOT, Stack, wait_for

pytestmark = pytest.mark.faults

MESSAGES = 24


class SupervisedStack(Stack):
    """The test stack with its worker started, watched and restarted by the real supervisor."""

    def start_worker(self) -> None:
        log = self.tmp / "worker.log"
        self.logs["worker"] = log
        self._worker_log_from = log.stat().st_size if log.exists() else 0
        argv = [str(BIN / "celery"), "-A", "worker.celery_app",
                "worker", "--pool", "threads", "--concurrency", str(self.worker_concurrency),
                "-Q", "chat", "--loglevel", "INFO", "--without-gossip", "--without-mingle"]
        self.supervisor = Supervisor(
            [Program("worker", argv, restart=True, stdout=log)],
            policy=RestartPolicy(first_delay_s=1.0, max_restarts=3, window_s=120),
            env={**os.environ, **self.env}, cwd=ROOT)
        self.supervisor.start()
        self._stop_supervising = threading.Event()
        self._supervising = threading.Thread(target=self.supervisor.run,
                                             args=(self._stop_supervising, 0.2), daemon=True)
        self._supervising.start()

    def stop_processes(self) -> None:
        self._stop_supervising.set()
        self._supervising.join(timeout=10)
        self.supervisor.stop()
        super().stop_processes()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    s = SupervisedStack(tmp_path_factory.mktemp("supervised"), db_kind="postgres",
                        redis_url=redis_server.url(0), model_delay_s=0.3,
                        extra_env={"SWEEP_QUEUED_AFTER_S": "3", "CLAIM_LEASE_S": "4"}).start()
    yield s
    s.stop()


def test_redis_restart_then_worker_kill_every_message_answered_once(stack, redis_server, caplog):
    caplog.set_level(logging.INFO, logger="supervisor")
    users = [u["userid"] for u in stack.emu("GET", "directory")["users"]][:6]
    expected: dict[str, list[str]] = {}
    for i in range(MESSAGES):
        expected.setdefault(users[i % len(users)], []).append(f"监管 {i}")
    order = [(u, t) for i in range(4) for u, ts in expected.items() for t in ts[i:i + 1]]

    def arrive():
        for i, (user, text) in enumerate(order):
            stack.send(user, text, wait=True)
            if i % 3 == 2:
                time.sleep(0.4)

    first_pid = stack.supervisor.pid("worker")
    sender = threading.Thread(target=arrive)
    sender.start()

    time.sleep(1.0)
    redis_server.stop()
    time.sleep(2.0)
    redis_server.start()
    wait_for(lambda: stack.log("worker").count("Connected to redis") >= 2, timeout=60,
             what="the worker to reconnect to Redis")
    assert stack.supervisor.pid("worker") == first_pid, "the Redis restart cost a worker restart"
    assert stack.supervisor.restart_count == 0

    os.killpg(first_pid, signal.SIGKILL)
    wait_for(lambda: stack.supervisor.pid("worker") not in (None, first_pid), timeout=30,
             what="the supervisor to restart the worker")
    wait_for(stack.worker_ready, 60, what="the restarted worker")
    sender.join(timeout=120)
    assert not sender.is_alive()

    wait_answered(stack, expected, timeout=120)
    wait_for(lambda: all(r["status"] == "answered" for r in stack.outbox_rows()), timeout=60,
             what="every row answered")
    assert len(stack.outbox_rows()) == MESSAGES
    assert answered_once(stack, expected) == {}
    assert stack.emu("GET", "stats")["apis"]["message/send"]["delivered"] == MESSAGES
    assert stack.supervisor.restart_count == 1
    assert "restarting in 1.0s (restart 1 of at most 3 per 120s)" in caplog.text
    assert "Unrecoverable error" not in stack.log("worker")
    codes = {a["status_code"] for a in stack.emu("GET", "callbacks")["attempts"]}
    assert codes == {200}  # every callback acknowledged; nothing answered 5xx
