"""Audit events and spend to the SIEM: syslog over TLS (RFC 5424/5425) and OpenTelemetry logs
(OTLP/HTTP JSON), at least once, from a cursor stored in the database (docs/siem.md).

- ``records``: the events read past a cursor (audit by seq, usage by id below a safe horizon),
  as ``Record``s; which sealed payload fields leave decrypted;
- ``syslog``: RFC 5424 messages, octet-counted frames, the TLS sink;
- ``otlp``: the OTLP logs request and its HTTP sink;
- ``sinks``: the "not received" error, TLS contexts, the sinks the settings turn on;
- ``cursors``: the stored cursors, moved forward by compare-and-set;
- ``exporter``: one run (the beat's ``worker.tasks.siem_export``, or ``app.cli siem export``).
"""

from app.siem.configured import build_sinks
from app.siem.exporter import Exporter, RunResult, export_once
from app.siem.records import Record
from app.siem.sinks import SinkError

__all__ = ["Exporter", "Record", "RunResult", "SinkError", "build_sinks", "export_once"]
