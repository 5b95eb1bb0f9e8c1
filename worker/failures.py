"""How working on a message can stop, for the processor and the deliveries alike."""

from __future__ import annotations


class LeaseLost(Exception):
    """Another worker took over the row (our lease expired): stop without sending."""


class TransientFailure(Exception):
    """Worth retrying later: the model or WeCom is briefly unavailable, or WeCom's frequency
    limit refused the send (``rate_limited``; ``retry_after``: a wait the server asked for)."""

    def __init__(self, reason: str, rate_limited: bool = False, retry_after: float | None = None):
        super().__init__(reason)
        self.rate_limited = rate_limited
        self.retry_after = retry_after


class PermanentFailure(Exception):
    def __init__(self, reason: str, notify: bool = True):
        super().__init__(reason)
        self.reason = reason
        self.notify = notify
