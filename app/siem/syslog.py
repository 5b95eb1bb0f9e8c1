"""The syslog sink: RFC 5424 messages, octet-counted (RFC 6587 3.4.1, as RFC 5425 frames them
over TLS), one TLS connection per batch.

A message::

    <109>1 2026-12-08T02:00:00.123456Z host wecom-bot - message_received [audit@32473 seq="7"
    type="message_received" actor="..." ... payload_sealed="k1:..."][payload@32473 msg_type="text"]
    audit seq=7 message_received ok

PRI is facility x 8 + severity (facility ``SIEM_SYSLOG_FACILITY``, 13 "log audit" by default;
severity 5 notice, 4 warning for the events ``records.WARNING_EVENTS`` lists). MSGID is the
event type (``usage`` for spend). The event's columns are one SD-ELEMENT (``audit@PEN`` or
``usage@PEN``), the payload fields sent decrypted another (``payload@PEN``). A message longer
than ``SIEM_SYSLOG_MAX_BYTES`` leaves the sealed payload out (``truncated="payload_sealed"``),
then the decrypted fields.

**What counts as received.** Syslog over TLS has no acknowledgement (RFC 5425; RELP would be
one). The batch is taken as received when the receiver closes after us in order: we send our
close_notify and wait for the receiver's, or for its end of stream. A receiver that stopped
reading closes with data unread, which TCP answers with a reset; one that is gone refuses or
never answers: those batches are not received and are sent again. What stays out of reach is a
receiver that read the bytes and lost them before writing them down.
"""

from __future__ import annotations

import socket
import ssl
from datetime import UTC
from urllib.parse import urlsplit

from app.siem.records import Record
from app.siem.sinks import SinkError, tls_context

NILVALUE = "-"
BOM = "\ufeff"
NOTICE, WARNING = 5, 4
_SD_NAME_BAD = set('= ]"')


def sd_name(name: str) -> str:
    """An SD-NAME: 1 to 32 printable US-ASCII characters, none of ``= ]"``."""
    cleaned = "".join(c if "!" <= c <= "~" and c not in _SD_NAME_BAD else "_" for c in name)
    return cleaned[:32] or "_"


def param_value(value) -> str:
    """A PARAM-VALUE: UTF-8 with ``"``, ``\\`` and ``]`` escaped by a backslash."""
    text = str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def sd_element(sd_id: str, params: dict) -> str:
    if not params:
        return ""
    inner = " ".join(f'{sd_name(k)}="{param_value(v)}"' for k, v in params.items())
    return f"[{sd_id} {inner}]"


def header_field(value: str, limit: int) -> str:
    """HOSTNAME, APP-NAME, MSGID: printable US-ASCII, no spaces, bounded; "-" when empty."""
    cleaned = "".join(c for c in (value or "") if "!" <= c <= "~")[:limit]
    return cleaned or NILVALUE


class SyslogFormat:
    """Records to RFC 5424 messages (bytes, before framing)."""

    def __init__(self, facility: int, enterprise_id: str, hostname: str, app_name: str,
                 max_bytes: int):
        self.facility, self.enterprise_id = facility, enterprise_id
        self.hostname = header_field(hostname, 255)
        self.app_name = header_field(app_name, 48)
        self.max_bytes = max_bytes

    def message(self, record: Record) -> bytes:
        pri = self.facility * 8 + (WARNING if record.warning else NOTICE)
        stamp = record.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        head = (f"<{pri}>1 {stamp} {self.hostname} {self.app_name} {NILVALUE} "
                f"{header_field(record.kind, 32)} ")
        msg = record.summary if record.summary.isascii() else BOM + record.summary
        fields, clear = dict(record.fields), dict(record.clear)
        for dropping in (None, "payload_sealed", "payload"):
            if dropping == "payload_sealed":
                fields.pop("payload_sealed", None)
                fields["truncated"] = "payload_sealed"
            elif dropping == "payload":
                clear = {}
                fields["truncated"] = "payload_sealed,payload"
            data = (sd_element(f"{record.stream}@{self.enterprise_id}", fields)
                    + sd_element(f"payload@{self.enterprise_id}", clear)) or NILVALUE
            raw = (head + data + " " + msg).encode("utf-8")
            if len(raw) <= self.max_bytes:
                return raw
        return raw  # the columns alone: bounded (hashes, ids, short strings)


def frame(message: bytes) -> bytes:
    """Octet counting: ``MSG-LEN SP SYSLOG-MSG``."""
    return str(len(message)).encode() + b" " + message


class SyslogSink:
    """Sends a batch over one connection and returns once the receiver has taken it."""

    name = "syslog"

    def __init__(self, url: str, form: SyslogFormat, timeout_s: float, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.tls = parts.scheme == "tls"
        self.form, self.timeout_s = form, timeout_s
        self.context = tls_context(ca_file, cert_file, key_file) if self.tls else None

    def send(self, records: list[Record]) -> None:
        data = b"".join(frame(self.form.message(r)) for r in records)
        try:
            raw = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as exc:
            raise SinkError("connect", exc) from None
        try:
            if self.context is not None:
                try:
                    conn = self.context.wrap_socket(raw, server_hostname=self.host)
                except ssl.SSLCertVerificationError as exc:
                    raise SinkError("tls: certificate refused", exc, permanent=True) from None
                except (OSError, ssl.SSLError) as exc:
                    raise SinkError("tls handshake", exc) from None
                self._send_and_close_tls(conn, data)
            else:
                self._send_and_close_tcp(raw, data)
        finally:
            raw.close()

    @staticmethod
    def _send_and_close_tls(conn: ssl.SSLSocket, data: bytes) -> None:
        try:
            conn.sendall(data)
        except OSError as exc:
            raise SinkError("send", exc) from None
        try:
            conn.unwrap()  # our close_notify, then the receiver's: it read to the end
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
            return  # it closed without a close_notify, in order: it read to the end too
        except (OSError, ssl.SSLError) as exc:  # reset (data left unread), timeout
            raise SinkError("close", exc) from None

    @staticmethod
    def _send_and_close_tcp(conn: socket.socket, data: bytes) -> None:
        try:
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(4096):  # the receiver's end of stream, after it read ours
                pass
        except OSError as exc:
            raise SinkError("send", exc) from None
