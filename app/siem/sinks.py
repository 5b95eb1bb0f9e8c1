"""What the two sinks share: the error that means "not received", the TLS context, and building
the sinks the settings name."""

from __future__ import annotations

import socket
import ssl


class SinkError(Exception):
    """The receiver did not take the batch: the cursor stays, the batch is sent again next run.
    ``permanent``: retrying as is will not help (a refused certificate, a 4xx from the
    collector): the operator has to act; the message says what, never what was sent."""

    def __init__(self, reason: str, cause: BaseException | str | None = None, *, permanent: bool = False):
        detail = cause if isinstance(cause, str) else (type(cause).__name__ if cause else "")
        if isinstance(cause, BaseException) and str(cause):
            detail = f"{type(cause).__name__}: {str(cause)[:120]}"
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.permanent = permanent


def tls_context(ca_file: str | None, cert_file: str | None, key_file: str | None) -> ssl.SSLContext:
    """Verify the receiver against ``ca_file`` (else the system's CAs), TLS 1.2 at least; present
    ``cert_file`` (and ``key_file``) when the receiver asks for a client certificate."""
    context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context


def build_sinks(settings) -> list:
    """The sinks ``settings`` turn on (none when neither URL is set)."""
    from app.siem.otlp import OtlpSink
    from app.siem.syslog import SyslogFormat, SyslogSink

    s = settings
    sinks: list = []
    if s.siem_syslog_url:
        form = SyslogFormat(s.siem_syslog_facility, s.siem_syslog_enterprise_id, socket.gethostname(),
                            s.siem_app_name, s.siem_syslog_max_bytes)
        sinks.append(SyslogSink(s.siem_syslog_url, form, s.siem_timeout_s, s.siem_syslog_ca_file,
                                s.siem_syslog_client_cert_file, s.siem_syslog_client_key_file))
    if s.siem_otlp_url:
        from app.config.siem import parse_headers

        headers = parse_headers(s.siem_otlp_headers.get_secret_value() if s.siem_otlp_headers else "")
        sinks.append(OtlpSink(s.siem_otlp_url, s.siem_app_name, s.siem_timeout_s, headers,
                              s.siem_otlp_ca_file, s.siem_otlp_client_cert_file,
                              s.siem_otlp_client_key_file))
    return sinks
