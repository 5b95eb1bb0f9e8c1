"""The sinks the settings name, built once a run (a module of its own: both sinks import
``app.siem.sinks`` for what they share, so building them there would be an import cycle)."""

from __future__ import annotations

import socket

from app.siem.otlp import OtlpSink
from app.siem.syslog import SyslogFormat, SyslogSink


def build_sinks(settings) -> list:
    """The sinks ``settings`` turn on (none when neither URL is set)."""
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
