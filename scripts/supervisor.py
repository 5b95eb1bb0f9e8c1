"""A small process supervisor for ``make run``: restart what may die, stop on what may not.

``scripts/run_stack.py`` runs the emulator, gunicorn, the Celery worker and beat on one machine.
gunicorn's master already replaces its own dead workers; the Celery worker and beat have nobody
doing that for them (in production Docker's ``restart: unless-stopped`` or systemd's
``Restart=always`` does), so here a dead worker or beat is started again after a backoff:
1 s, 2 s, 4 s ... up to ``max_delay_s``, starting over once a process has stayed up for
``healthy_after_s``. The rate is bounded: a process that needs more than ``max_restarts``
restarts within ``window_s`` is broken (bad settings, a missing model), not unlucky, and the
supervisor gives up and stops the whole stack with that reason instead of looping.

Each program runs in its own process group, so a restart or a stop also ends whatever it left
behind (a killed worker's children), and the terminal's Ctrl-C reaches only the supervisor,
which then stops every program in order. Every decision is logged (logger ``supervisor``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("supervisor")


@dataclass
class Program:
    """One process to run. ``restart``: start it again when it exits; else its exit ends all.

    ``nice`` (0..19) lowers its CPU priority, e.g. so that the web acknowledgements WeCom waits
    for are served before background answers on a small machine. ``stdout``: a file to append
    its output to (else the supervisor's own terminal). ``env``: variables of its own.
    """

    name: str
    argv: list[str]
    restart: bool = False
    nice: int = 0
    stdout: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # over the supervisor's environment


@dataclass
class RestartPolicy:
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    max_restarts: int = 5  # within window_s; one more and the supervisor gives up
    window_s: float = 300.0
    healthy_after_s: float = 60.0  # up this long: the next failure backs off from the start

    def delay(self, consecutive_failures: int) -> float:
        """Seconds to wait before restart number ``consecutive_failures`` (1, 2, ...)."""
        return min(self.max_delay_s, self.first_delay_s * 2 ** max(0, consecutive_failures - 1))


@dataclass
class _Running:
    program: Program
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restart_at: float | None = None  # a restart is scheduled for this monotonic time
    failures: int = 0  # consecutive quick exits
    restarts: deque = field(default_factory=deque)  # monotonic times of recent restarts


class Supervisor:
    def __init__(self, programs: list[Program], policy: RestartPolicy | None = None,
                 env: dict[str, str] | None = None, cwd: Path | str | None = None):
        if len({p.name for p in programs}) != len(programs):
            raise ValueError("program names must be unique")
        self.policy = policy or RestartPolicy()
        self.env = env
        self.cwd = cwd
        self._programs = {p.name: _Running(p) for p in programs}
        self._lock = threading.Lock()
        self.restart_count = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, *names: str) -> None:
        """Start the named programs (all when none is named) that are not running."""
        with self._lock:
            for name in names or tuple(self._programs):
                running = self._programs[name]
                if running.proc is None or running.proc.poll() is not None:
                    self._spawn(running)

    def pid(self, name: str) -> int | None:
        proc = self._programs[name].proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def poll(self) -> str | None:
        """One look at every program: schedule or perform restarts. A reason to stop, or None."""
        now = time.monotonic()
        with self._lock:
            for running in self._programs.values():
                if running.restart_at is not None:
                    if now >= running.restart_at:
                        running.restart_at = None
                        self._spawn(running)
                    continue
                proc = running.proc
                if proc is None or proc.poll() is None:
                    continue
                reason = self._exited(running, now)
                if reason:
                    return reason
        return None

    def run(self, stop: threading.Event | None = None, interval_s: float = 0.5) -> str:
        """Supervise until a program that may not die dies, the restart budget is spent, or
        ``stop`` is set; the reason. The programs are still running (or not) afterwards: call
        ``stop()``."""
        stop = stop or threading.Event()
        while not stop.is_set():
            reason = self.poll()
            if reason:
                return reason
            stop.wait(interval_s)
        return "asked to stop"

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM every program's process group, SIGKILL what is left after ``grace_s``."""
        with self._lock:
            procs = []
            for running in self._programs.values():
                running.restart_at = None
                if running.proc is not None:
                    procs.append(running.proc)
                    _signal_group(running.proc, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
                _signal_group(proc, signal.SIGKILL)  # children it left behind

    # -- internals ------------------------------------------------------------------------------
    def _spawn(self, running: _Running) -> None:
        program = running.program
        out = open(program.stdout, "ab") if program.stdout else None  # noqa: SIM115
        try:
            running.proc = subprocess.Popen(
                program.argv, env={**(os.environ if self.env is None else self.env), **program.env}
                if program.env else self.env, cwd=self.cwd, stdout=out,
                stderr=subprocess.STDOUT if out else None, start_new_session=True,
                preexec_fn=_niceness(program.nice))
        finally:
            if out is not None:
                out.close()  # the child has its own descriptor
        running.started_at = time.monotonic()
        log.info("supervisor: started %s (pid %s%s)", program.name, running.proc.pid,
                 f", nice {program.nice}" if program.nice else "")

    def _exited(self, running: _Running, now: float) -> str | None:
        program, proc = running.program, running.proc
        code = proc.returncode
        uptime = now - running.started_at
        _signal_group(proc, signal.SIGKILL)  # whatever the dead process left in its group
        if not program.restart:
            return f"{program.name} (pid {proc.pid}) exited with code {code} after {uptime:.1f}s"
        policy = self.policy
        while running.restarts and now - running.restarts[0] > policy.window_s:
            running.restarts.popleft()
        if len(running.restarts) >= policy.max_restarts:
            log.error("supervisor: %s exited with code %s after %.1fs; it was restarted %d times "
                      "within %.0fs already, giving up", program.name, code, uptime,
                      len(running.restarts), policy.window_s)
            return (f"{program.name} restarted {len(running.restarts)} times within "
                    f"{policy.window_s:.0f}s and died again (code {code})")
        running.failures = 1 if uptime >= policy.healthy_after_s else running.failures + 1
        delay = policy.delay(running.failures)
        running.restarts.append(now)
        running.restart_at = now + delay
        self.restart_count += 1
        log.warning("supervisor: %s (pid %s) exited with code %s after %.1fs; restarting in "
                    "%.1fs (restart %d of at most %d per %.0fs)", program.name, proc.pid, code,
                    uptime, delay, len(running.restarts), policy.max_restarts, policy.window_s)
        return None


def _niceness(increment: int):
    if not increment:
        return None
    return lambda: os.nice(increment)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    # Each program leads its own group (start_new_session), so its pid is the group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
