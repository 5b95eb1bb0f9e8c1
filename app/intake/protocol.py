"""The callback's intake protocol: what both callbacks (``app.web.callback``, ``app.web.aibot_callback``)
and the long connection call to make a message durable, and the one error they answer 503 for.

Two implementations: ``app.intake.client.RemoteIntake`` (the intake server's client, under
gunicorn) and ``app.intake.local.LocalIntake`` (a writer thread in this process); ``Services.intake``
picks one.
"""

from __future__ import annotations

from typing import Protocol

from app.outbox.rows import Accepted, Arrival, Prepared


class IntakeUnavailable(Exception):
    """The message was not (known to be) written: answer 503 so that WeCom retries."""


class Intake(Protocol):
    def accept(self, arrival: Arrival, fingerprint: str | None = None) -> Accepted:
        """Write ``arrival`` (and its audit event, when it is new) and return its row. A new
        row's task is published after the commit, unless ``arrival.enqueue`` is false.
        Raises ``IntakeUnavailable`` when the row is not known to be written."""

    def accept_prepared(self, prepared: Prepared) -> Accepted:
        """``accept`` for a message prepared already (``app.outbox.rows.prepare``)."""
