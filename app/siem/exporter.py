"""One export run: every sink takes every stream past its cursor, in bounded batches.

The beat runs it every ``SIEM_INTERVAL_S`` (``worker.tasks.siem_export``); ``python -m app.cli
siem export`` runs it by hand. For each sink and stream: read the cursor, read up to
``SIEM_BATCH_SIZE`` events past it, send them, and move the cursor to the last one once the
receiver has taken them (``app.siem.sinks.SinkError`` otherwise: the cursor stays, the run goes
on to the next sink and the batch is sent again next run). At most ``SIEM_MAX_BATCHES`` batches
a sink and stream per run, and no new batch after the run's time is up, so a backlog (a new
sink taking the kept history, a receiver back from an outage) drains over several runs without
holding a worker thread for long.

At least once: an event is sent again only when the batch it was in was not acknowledged (the
receiver went away mid-batch, an answer lost); nothing behind the cursor is sent twice and
nothing past it is skipped. A Redis lock per sink keeps two runs from sending the same batch at
once (a run that finds it taken does nothing); the cursor's compare-and-set holds even without it.
"""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from dataclasses import dataclass, field

from app.audit.chain import EventType
from app.metrics import counters as metrics
from app.siem import cursors
from app.siem.records import audit_anchor, audit_batch, usage_batch, usage_horizon

log = logging.getLogger(__name__)
LOCK_KEY = "siem:export:"


@dataclass
class StreamResult:
    sent: int = 0
    batches: int = 0
    position: int = 0
    error: str | None = None
    purged_unsent: int = 0


@dataclass
class RunResult:
    streams: dict[str, StreamResult] = field(default_factory=dict)  # "sink/stream" -> result
    skipped: list[str] = field(default_factory=list)  # sinks another run holds

    def as_dict(self) -> dict:
        return {key: vars(value) for key, value in self.streams.items()} | (
            {"skipped": self.skipped} if self.skipped else {})


class Exporter:
    def __init__(self, services, sinks: list, *, clock=time.monotonic):
        self.services = services
        self.settings = services.settings
        self.sinks = sinks
        self.clock = clock

    @property
    def policy(self) -> str:
        """The payload policy as stored beside the audit cursors: "" sealed, "*", or the list."""
        return self.settings.siem_payload_fields

    def run(self) -> RunResult:
        s = self.settings
        result = RunResult()
        budget = max(60.0, 3 * s.siem_interval_s)
        deadline = self.clock() + budget
        if "audit" in s.siem_stream_names:
            for sink in self.sinks:  # before any export: each sink then takes the others' events
                self._record_policy(sink, cursors.load(self.services.db, sink.name, "audit"))
        for sink in self.sinks:
            lock = self.services.redis.lock(LOCK_KEY + sink.name, blocking=False,
                                            timeout=budget + 4 * s.siem_timeout_s + 30)
            try:
                held = lock.acquire()
            except Exception as exc:  # noqa: BLE001 - without the lock, this run sends nothing
                log.warning("siem %s: run lock unavailable (%s); skipped", sink.name, type(exc).__name__)
                held = False
            if not held:
                result.skipped.append(sink.name)
                continue
            try:
                for stream in s.siem_stream_names:
                    result.streams[f"{sink.name}/{stream}"] = self.export(sink, stream, deadline)
            finally:
                with suppress(Exception):  # it expires by itself
                    lock.release()
        return result

    def export(self, sink, stream: str, deadline: float) -> StreamResult:
        """Send ``stream`` past ``sink``'s cursor until caught up, a batch fails, or time is up."""
        s, db = self.settings, self.services.db
        cursor = cursors.load(db, sink.name, stream)
        out = StreamResult(position=cursor.position)
        if stream == "audit":
            out.purged_unsent = self._skip_purged(sink, cursor)
            out.position += out.purged_unsent
            horizon = None
        else:
            horizon = usage_horizon(db)
            if horizon is None:
                return out
        position = out.position
        for _ in range(s.siem_max_batches):
            if self.clock() >= deadline:
                break
            records = self._read(stream, position, horizon)
            if not records:
                break
            try:
                sink.send(records)
            except Exception as exc:  # noqa: BLE001 - SinkError, or a bug: the cursor stays either way
                out.error = str(exc)[:200] or type(exc).__name__
                metrics.SIEM_FAILURES.labels(sink=sink.name, stream=stream).inc()
                log.warning("siem %s/%s: batch after %d not received (%s); sent again next run",
                            sink.name, stream, position, out.error)
                with suppress(Exception):
                    cursors.note(db, sink.name, stream, error=out.error)
                break
            new = records[-1].position
            if not cursors.advance(db, sink.name, stream, position, new, len(records)):
                log.warning("siem %s/%s: the cursor moved under this run (another exporter); "
                            "stopping", sink.name, stream)
                break
            out.sent += len(records)
            out.batches += 1
            position = out.position = new
            metrics.SIEM_EXPORTED.labels(sink=sink.name, stream=stream).inc(len(records))
            if len(records) < s.siem_batch_size:
                break
        if out.sent:
            log.info("siem %s/%s: sent %d events in %d batches, now at %d", sink.name, stream,
                     out.sent, out.batches, out.position)
        return out

    def _read(self, stream: str, after: int, horizon: int | None):
        s, services = self.settings, self.services
        with services.db.reader() as session:
            if stream == "audit":
                return audit_batch(session, services.cipher, after, s.siem_batch_size,
                                   s.siem_clear_fields)
            return usage_batch(session, after, s.siem_batch_size, horizon)

    def _skip_purged(self, sink, cursor) -> int:
        """Events purged (past the retention) before this sink took them are gone: say how many,
        loudly, and go on from the purge anchor."""
        with self.services.db.reader() as session:
            anchor = audit_anchor(session)
        if cursor.position >= anchor:
            return 0
        lost = anchor - cursor.position
        log.error("siem %s/audit: %d events (seq %d..%d) were purged before this sink took them",
                  sink.name, lost, cursor.position + 1, anchor)
        if cursors.advance(self.services.db, sink.name, "audit", cursor.position, anchor, 0):
            return lost
        return 0

    def _record_policy(self, sink, cursor) -> None:
        """The first run under a payload policy other than the last writes an ``export`` audit
        event (who may read what left is in the chain), then notes the policy on the cursor."""
        if cursor.clear_fields == self.policy:
            return
        self.services.audit.record(self.services.db, EventType.EXPORT, actor="system", outcome="siem",
                                   payload={"sink": sink.name, "stream": "audit",
                                            "payload_fields": self.policy or "(sealed)",
                                            "previous": cursor.clear_fields})
        cursors.note(self.services.db, sink.name, "audit", clear_fields=self.policy,
                     error=cursor.last_error)


def export_once(services) -> RunResult:
    """One run with the sinks the settings name (none: nothing to do)."""
    from app.siem.configured import build_sinks

    return Exporter(services, build_sinks(services.settings)).run()
