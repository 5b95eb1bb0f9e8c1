"""The emulator's background threads (callback deliveries, AI-bot conversations), joinable.

WeCom works asynchronously; the emulator mirrors that with daemon threads, and tests join them
so that nothing is still delivering when a test ends.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


class BackgroundThreads:
    """Starts daemon threads that log a crash instead of dying silently, and joins them all."""

    def __init__(self, name: str, what: str) -> None:
        self.name = name
        self.what = what
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def start(self, target, *args) -> None:
        thread = threading.Thread(target=self._run, args=(target, *args), daemon=True, name=self.name)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _run(self, target, *args) -> None:
        try:
            target(*args)
        except Exception:  # noqa: BLE001 - a background thread must never die silently
            log.exception("%s crashed", self.what)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def join(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
