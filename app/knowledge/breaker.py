"""Leave a model server that just failed alone for a while (a circuit breaker, per process).

Why: retrieval goes on without a failing embeddings or reranking server, but a server that hangs
costs each question its whole timeout first (``EMBEDDINGS_TIMEOUT_S`` 30 s, ``RERANK_TIMEOUT_S``
10 s): under an outage every answer would be that much late. After a failure the next questions
go on without it at once; after ``KB_SERVER_RETRY_S`` one question tries it again (the others
still go on without it while that one waits), and a success closes the breaker.
"""

from __future__ import annotations

import threading
import time


class Breaker:
    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._closed_from: dict[str, float] = {}  # server -> when it may be tried again

    def allows(self, server: str, retry_s: float) -> bool:
        """Whether to call ``server`` now; a caller let through after a failure is the one
        trial (the others are held off for another ``retry_s`` while it runs)."""
        with self._lock:
            until = self._closed_from.get(server)
            if until is None:
                return True
            now = self._clock()
            if now < until:
                return False
            self._closed_from[server] = now + retry_s
            return True

    def failed(self, server: str, retry_s: float) -> None:
        with self._lock:
            self._closed_from[server] = self._clock() + retry_s

    def succeeded(self, server: str) -> None:
        with self._lock:
            self._closed_from.pop(server, None)

