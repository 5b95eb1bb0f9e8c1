"""scripts/supervisor.py with real (tiny) processes: restarts with backoff, a bounded restart
rate, a process that may not die stopping everything, niceness, and whole process groups."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time

import pytest

from scripts.supervisor import Program, RestartPolicy, Supervisor

PY = sys.executable


def crash(code: int = 3) -> list[str]:
    return [PY, "-c", f"import sys; sys.exit({code})"]


def sleeper(seconds: float = 30) -> list[str]:
    return [PY, "-c", f"import time; time.sleep({seconds})"]


def run_until_done(supervisor: Supervisor, timeout: float = 20.0) -> str:
    stop = threading.Event()
    timer = threading.Timer(timeout, stop.set)
    timer.start()
    try:
        return supervisor.run(stop, interval_s=0.02)
    finally:
        timer.cancel()
        supervisor.stop(grace_s=5)


def test_backoff_doubles_up_to_the_cap():
    policy = RestartPolicy(first_delay_s=1, max_delay_s=30)
    assert [policy.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_a_crashing_program_is_restarted_with_backoff_then_given_up(caplog):
    policy = RestartPolicy(first_delay_s=0.05, max_delay_s=0.2, max_restarts=4, window_s=60)
    supervisor = Supervisor([Program("worker", crash(3), restart=True),
                             Program("web", sleeper())], policy=policy)
    caplog.set_level(logging.INFO, logger="supervisor")
    supervisor.start()
    started = time.monotonic()
    reason = run_until_done(supervisor)
    elapsed = time.monotonic() - started

    assert reason == "worker restarted 4 times within 60s and died again (code 3)"
    assert supervisor.restart_count == 4
    assert elapsed >= 0.05 + 0.1 + 0.2 + 0.2  # the delays were waited, not skipped
    delays = re.findall(r"restarting in ([\d.]+)s", caplog.text)
    assert delays == ["0.1", "0.1", "0.2", "0.2"]  # 0.05, 0.1, 0.2, 0.2 as logged (%.1f)
    assert "giving up" in caplog.text
    assert supervisor.pid("web") is None  # stop() ended the rest


def test_a_program_that_may_not_die_stops_the_stack():
    supervisor = Supervisor([Program("web", crash(1)), Program("worker", sleeper(), restart=True)])
    supervisor.start()
    assert run_until_done(supervisor).startswith("web (pid ")
    assert supervisor.restart_count == 0


def test_the_backoff_starts_over_after_a_healthy_run(tmp_path):
    # Up for longer than healthy_after_s, then dies: the first delay again, not a doubled one.
    flag = tmp_path / "ran"
    script = (f"import os, sys, time\n"
              f"if os.path.exists({str(flag)!r}): time.sleep(0.3)\n"
              f"open({str(flag)!r}, 'a').close(); sys.exit(2)\n")
    policy = RestartPolicy(first_delay_s=0.05, max_delay_s=5, max_restarts=3, window_s=60,
                           healthy_after_s=0.2)
    supervisor = Supervisor([Program("beat", [PY, "-c", script], restart=True)], policy=policy)
    supervisor.start()
    delays = []
    original = policy.delay
    policy.delay = lambda n: delays.append(n) or original(n)
    run_until_done(supervisor)
    assert delays[:3] == [1, 1, 1]  # every later run stayed up 0.3 s >= healthy_after_s


def test_niceness_and_output_file(tmp_path):
    out = tmp_path / "worker.log"
    program = Program("worker", [PY, "-c", "import os; print('nice', os.nice(0), flush=True)"],
                      restart=False, nice=7, stdout=out)
    supervisor = Supervisor([program])
    supervisor.start()
    run_until_done(supervisor)
    base = os.nice(0)
    assert out.read_text().strip() == f"nice {min(19, base + 7)}"


def test_a_programs_own_variables_go_over_the_stacks(tmp_path):
    """make run's two gunicorns: one environment, each its own WEB_ROLE and address."""
    out = tmp_path / "api.log"
    script = "import os; print(os.environ['WEB_ROLE'], os.environ['SHARED'], flush=True)"
    program = Program("api", [PY, "-c", script], stdout=out, env={"WEB_ROLE": "api"})
    supervisor = Supervisor([program], env={**os.environ, "WEB_ROLE": "web", "SHARED": "yes"})
    supervisor.start()
    run_until_done(supervisor)
    assert out.read_text().strip() == "api yes"


def test_stop_ends_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = ("import subprocess, sys, time\n"
              f"child = subprocess.Popen([{PY!r}, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
              "time.sleep(60)\n")
    supervisor = Supervisor([Program("worker", [PY, "-c", script], restart=True)])
    supervisor.start()
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    supervisor.stop(grace_s=5)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_names_must_be_unique():
    with pytest.raises(ValueError):
        Supervisor([Program("a", sleeper()), Program("a", sleeper())])
