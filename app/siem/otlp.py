"""The OpenTelemetry sink: OTLP/HTTP with the JSON encoding, ``POST /v1/logs``.

A batch is one ``ExportLogsServiceRequest``: one resource (``service.name`` = SIEM_APP_NAME,
``host.name``), one scope per stream (``wecom-bot.audit``, ``wecom-bot.usage``), a log record
per event: ``timeUnixNano`` the event's time, severity INFO or WARN, the body the record's one
line, the columns as attributes (``audit.seq``, ``audit.type``, ..., ``usage.cost``) and each
payload field sent decrypted as ``audit.payload.<name>``. 64-bit integers are JSON strings, as
the OTLP JSON mapping asks. JSON rather than protobuf: every collector that speaks OTLP/HTTP
takes both, and JSON needs no generated code (``opentelemetry-proto``) for one message type.

Received means the collector answered 2xx (the OTLP spec's "success"); a ``partialSuccess``
with rejected records is logged and counted but not sent again (the spec: retrying a rejected
record does not help). 429, 502, 503 and 504 are retryable, the next run sends the batch again;
any other status is the operator's to fix (the cursor stays, the error shows in ``siem status``).
"""

from __future__ import annotations

import json
import logging
import socket
from datetime import UTC, datetime

import requests

from app.siem.records import Record
from app.siem.sinks import SinkError

log = logging.getLogger(__name__)
INFO, WARN = 9, 13
RETRYABLE = (429, 502, 503, 504)


def any_value(value) -> dict:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    return {"stringValue": str(value)}


def attributes(pairs: dict) -> list[dict]:
    return [{"key": key, "value": any_value(value)} for key, value in pairs.items()]


def nanos(at: datetime) -> str:
    at = at.astimezone(UTC)
    return str(int(at.timestamp()) * 1_000_000_000 + at.microsecond * 1000)


def log_record(record: Record, observed: str) -> dict:
    attrs = {f"{record.stream}.{name}": value for name, value in record.fields.items()}
    attrs.update({f"{record.stream}.payload.{name}": value for name, value in record.clear.items()})
    return {
        "timeUnixNano": nanos(record.at),
        "observedTimeUnixNano": observed,
        "severityNumber": WARN if record.warning else INFO,
        "severityText": "WARN" if record.warning else "INFO",
        "body": {"stringValue": record.summary},
        "attributes": attributes({"event.kind": record.kind, **attrs}),
    }


def export_request(records: list[Record], service_name: str, hostname: str,
                   now: datetime | None = None) -> dict:
    """The ``ExportLogsServiceRequest`` of one batch (one stream)."""
    observed = nanos(now or datetime.now(UTC))
    scopes: dict[str, list[dict]] = {}
    for record in records:
        scopes.setdefault(record.stream, []).append(log_record(record, observed))
    return {"resourceLogs": [{
        "resource": {"attributes": attributes({"service.name": service_name, "host.name": hostname})},
        "scopeLogs": [{"scope": {"name": f"{service_name}.{stream}"}, "logRecords": logs}
                      for stream, logs in scopes.items()],
    }]}


class OtlpSink:
    name = "otlp"

    def __init__(self, url: str, service_name: str, timeout_s: float, headers: dict[str, str],
                 ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None):
        self.url = url if urlpath(url) not in ("", "/") else url.rstrip("/") + "/v1/logs"
        self.service_name, self.timeout_s = service_name, timeout_s
        self.hostname = socket.gethostname()
        self.http = requests.Session()
        self.http.headers.update({"Content-Type": "application/json", **headers})
        # per request, not on the session: requests lets REQUESTS_CA_BUNDLE override a
        # session's ``verify``, never a request's
        self.verify = ca_file or True
        self.cert = ((cert_file, key_file) if key_file else cert_file) if cert_file else None
        self.rejected = 0  # records the collector refused for good (partialSuccess), this process

    def send(self, records: list[Record]) -> None:
        body = json.dumps(export_request(records, self.service_name, self.hostname),
                          ensure_ascii=False, separators=(",", ":")).encode()
        try:
            response = self.http.post(self.url, data=body, timeout=self.timeout_s,
                                      verify=self.verify, cert=self.cert, allow_redirects=False)
        except requests.exceptions.SSLError as exc:
            raise SinkError("tls", exc) from None
        except requests.RequestException as exc:
            raise SinkError("connect", exc) from None
        status = response.status_code
        if status in RETRYABLE:
            raise SinkError(f"HTTP {status}", "the collector asks to retry later")
        if not 200 <= status < 300:
            raise SinkError(f"HTTP {status}", "the collector refused the batch", permanent=True)
        self._partial(response, len(records))

    def _partial(self, response: requests.Response, sent: int) -> None:
        try:
            answer = response.json() if response.content else {}
        except ValueError:
            return  # 2xx is success whatever the body says
        partial = answer.get("partialSuccess") if isinstance(answer, dict) else None
        if not isinstance(partial, dict):
            return
        try:
            rejected = int(partial.get("rejectedLogRecords") or 0)
        except (TypeError, ValueError):
            rejected = 0
        if rejected:
            self.rejected += rejected
            log.warning("siem otlp: the collector rejected %d of %d records: %s", rejected, sent,
                        str(partial.get("errorMessage") or "")[:200])


def urlpath(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).path
