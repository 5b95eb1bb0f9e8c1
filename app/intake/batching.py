"""One thread per process that takes what is waiting, as a batch.

The callbacks' group commit (``app.intake``) turns many request threads' messages into one
database transaction, and its task publishing into one Redis round trip: items are queued, a
single thread takes everything waiting (at least one, at most ``max_batch``) and hands it to
``handle``. A lone item waits for nobody. A forked process starts its own thread on first use;
an idle thread exits (the next item starts another), so nothing runs where nothing is sent.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class BatchThread:
    def __init__(self, name: str, handle: Callable[[list], None], max_batch: int = 64,
                 idle_s: float = 30.0):
        """``handle`` owns its errors; one that escapes is logged and the thread goes on."""
        self.name = name
        self.handle = handle
        self.max_batch = max_batch
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, item) -> None:
        """Queue ``item`` and make sure this process's thread runs. Both sides decide under one
        lock, so an item is never queued just as the thread leaves."""
        with self._lock:
            if self._pid != os.getpid():
                self._queue, self._thread, self._pid = queue.SimpleQueue(), None, os.getpid()
            self._queue.put(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait until everything put before this call has been handled (a process about to
        exit publishes what it committed); False if that took longer than ``timeout``."""
        done = threading.Event()
        self.put(_Flush(done))
        return done.wait(timeout)

    def _next_batch(self) -> list | None:
        """What is waiting (at least one item), or None when the thread should exit."""
        try:
            batch = [self._queue.get(timeout=self.idle_s)]
        except queue.Empty:
            with self._lock:
                if self._queue.empty():
                    self._thread = None
                    return None
            batch = [self._queue.get()]
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            flushes = [item for item in batch if type(item) is _Flush]
            if flushes:
                batch = [item for item in batch if type(item) is not _Flush]
            try:
                if batch:
                    self.handle(batch)
            except Exception:
                log.exception("%s: a batch of %d failed", self.name, len(batch))
            for flush in flushes:
                flush.done.set()


class _Flush:
    """A marker in the queue: set once every item before it has been handled."""

    __slots__ = ("done",)

    def __init__(self, done: threading.Event):
        self.done = done
