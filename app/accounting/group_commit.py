"""The ledger writer: one thread a process that writes the calls waiting together in one
transaction (a group commit).

``reserve`` and ``settle`` calls of one process that wait together are written by one writer
thread in one transaction, in order, each as it would be alone, with one lock of the period rows
and one commit for all: a company-wide budget no longer serialises every call on its row, only
every batch. Callers still return after their call committed. What a batch does is the
``commit`` callable's business (``Accounting.write_batch``); this module only gathers, hands
over and answers.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Job:
    """One ``reserve``, ``settle`` or ``audit`` waiting for the writer: its arguments, then its
    outcome."""

    __slots__ = ("kind", "args", "done", "result", "error", "thread")

    def __init__(self, kind: str, args):
        self.kind, self.args = kind, args
        self.thread = threading.get_ident()
        self.done = threading.Event()
        self.result = self.error = None

    def finish(self, result=None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


_FORK_GUARD = threading.Lock()
if hasattr(os, "register_at_fork"):  # a lock held by another thread at fork stays held in the child
    def _new_fork_guard():
        global _FORK_GUARD
        _FORK_GUARD = threading.Lock()

    os.register_at_fork(after_in_child=_new_fork_guard)


class GroupCommit:
    """The process's accounting writer: every ``reserve`` and ``settle`` waiting when it is free
    goes into one transaction (up to ``MAX_BATCH``), so the period rows are locked and written,
    and the transaction committed, once per batch instead of once per call. Callers wait for
    their batch's commit, as they waited for their own transaction before. The thread starts
    with the first call (and again in a forked child) and ends after ``IDLE_S`` without work.

    Callers come back together: the calls of a batch return at once and many call again (a
    reserve's settle, the next message) while the next batch is being written, which then holds
    the quickest of them and the rest wait a whole batch more (the callers split into cohorts
    that take turns, each batch half as full as it could be). So the writer lingers up to
    ``LINGER_S`` after a batch for the threads it answered to come back (or 256 calls). A call
    that comes within those 2 ms of a batch whose threads do not come back (a reserve's thread
    goes on to generate) waits the rest of them; one that comes later, or alone after its own
    call, does not wait.
    """

    MAX_BATCH = 256
    IDLE_S = 2.0
    LINGER_S = 0.002

    def __init__(self, commit: Callable[[list[Job]], None], idle: Callable[[], None]):
        self._commit = commit
        self._idle = idle  # called by the thread as it ends
        self._pid = 0
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._jobs: list[Job] = []
        self._running = False
        self._pid = os.getpid()

    def run(self, kind: str, args):
        if self._pid != os.getpid():
            with _FORK_GUARD:
                if self._pid != os.getpid():
                    self._reset()
        job = Job(kind, args)
        with self._cond:
            self._jobs.append(job)
            if self._running:
                self._cond.notify()
            else:
                self._running = True
                threading.Thread(target=self._loop, daemon=True, name="accounting-writer").start()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def _loop(self) -> None:
        answered, until = set(), 0.0  # the last batch's threads, and how long to wait for them
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait(self.IDLE_S)
                    if not self._jobs:
                        # Idle: the connection goes back to the pool, under the lock, so the
                        # thread that the next call starts never finds it half given back.
                        try:
                            self._idle()
                        except Exception:  # noqa: BLE001 - the next thread connects afresh
                            log.exception("accounting writer: could not give its connection back")
                        self._running = False
                        return
                while ((left := until - time.monotonic()) > 0 and len(self._jobs) < self.MAX_BATCH
                       and answered - {job.thread for job in self._jobs}):
                    self._cond.wait(left)
                batch, self._jobs = self._jobs[:self.MAX_BATCH], self._jobs[self.MAX_BATCH:]
            try:
                self._commit(batch)
            except BaseException as exc:  # noqa: BLE001 - never leave a caller waiting
                for job in batch:
                    if not job.done.is_set():
                        job.finish(error=exc)
            answered = {job.thread for job in batch}
            until = time.monotonic() + self.LINGER_S
