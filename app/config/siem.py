"""Audit and spend to the SIEM (app/siem, docs/siem.md): the two sinks (syslog over TLS, OTLP
logs), their TLS files, the batches, and which sealed payload fields may leave in clear."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from app.config.base import SettingsGroup, blank_is_unset
from app.config.secret_fields import URL, Secret

STREAMS = ("audit", "usage")


def header_values(raw: str) -> list[str]:
    """What a log line could show of ``SIEM_OTLP_HEADERS``: the whole and each header's value."""
    return [raw, *(value.strip() for _, _, value in (item.partition("=") for item in raw.split(","))
                   if value.strip())]


HEADERS = Secret(None, header_values)  # the collector decides how strong its token must be


def parse_headers(raw: str | None) -> dict[str, str]:
    """``name=value,name2=value2`` (as ``OTEL_EXPORTER_OTLP_HEADERS``); ValueError names a bad one
    by position, never by value."""
    headers: dict[str, str] = {}
    for index, item in enumerate((raw or "").split(","), start=1):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name or not value.strip() or any(c in name for c in " :\r\n"):
            raise ValueError(f"header {index} is not name=value")
        if any(c in value for c in "\r\n"):
            raise ValueError(f"header {index} has a line break in its value")
        headers[name] = value.strip()
    return headers


class SiemSettings(SettingsGroup):
    siem_syslog_url: Annotated[str | None, URL] = Field(
        default=None, description="tls://host:6514 (RFC 5425), or tcp://host:514 to a local relay; "
                                  "unset: no syslog sink")
    siem_syslog_ca_file: str | None = Field(default=None, description="CA bundle the receiver's "
                                            "certificate must chain to (default: the system's)")
    siem_syslog_client_cert_file: str | None = Field(default=None, description="client certificate "
                                                     "(PEM, may hold the key too) for mutual TLS")
    siem_syslog_client_key_file: str | None = None
    siem_syslog_facility: int = Field(default=13, ge=0, le=23, description="13: log audit")
    siem_syslog_enterprise_id: str = Field(
        default="32473", pattern=r"^[0-9]+(\.[0-9]+)*$",
        description="the private enterprise number in the structured data's SD-IDs "
                    "(32473 is the one RFC 5612 reserves for documentation: set your own)")
    siem_syslog_max_bytes: int = Field(default=8192, ge=2048, le=65536,
                                       description="a longer message leaves its sealed payload out")
    siem_otlp_url: Annotated[str | None, URL] = Field(
        default=None, description="the collector's OTLP/HTTP logs endpoint, e.g. "
                                  "https://collector:4318/v1/logs; unset: no OTLP sink")
    siem_otlp_ca_file: str | None = None
    siem_otlp_client_cert_file: str | None = None
    siem_otlp_client_key_file: str | None = None
    siem_otlp_headers: Annotated[SecretStr | None, HEADERS] = Field(
        default=None, description="name=value,... sent with every export (a collector's token)")
    siem_app_name: str = Field(default="wecom-bot", pattern=r"^[!-~]{1,48}$",
                               description="syslog APP-NAME and OTLP service.name")
    siem_streams: str = Field(default="audit,usage", description="what is exported: audit events, "
                                                                 "usage rows (spend), or both")
    siem_batch_size: int = Field(default=500, ge=1, le=5000)
    siem_max_batches: int = Field(default=20, ge=1, le=1000,
                                  description="batches a sink takes per run at most")
    siem_interval_s: float = Field(default=10.0, ge=1, le=3600, description="the beat's period")
    siem_timeout_s: float = Field(default=10.0, gt=0, le=120)
    siem_payload_fields: str = Field(
        default="", description="audit payload fields sent decrypted: empty (none: the payload "
                                "stays sealed), '*' (all), or a comma-separated list")

    @field_validator("siem_syslog_url", "siem_otlp_url", "siem_syslog_ca_file",
                     "siem_syslog_client_cert_file", "siem_syslog_client_key_file",
                     "siem_otlp_ca_file", "siem_otlp_client_cert_file", "siem_otlp_client_key_file",
                     "siem_otlp_headers", mode="before")
    @classmethod
    def _siem_blank_is_unset(cls, value):
        return blank_is_unset(value)

    @field_validator("siem_syslog_url")
    @classmethod
    def _syslog_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("tls", "tcp") or not parts.hostname or not parts.port:
            raise ValueError("must be tls://host:port (or tcp://host:port to a local relay)")
        return value

    @field_validator("siem_otlp_url")
    @classmethod
    def _otlp_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL such as https://collector:4318/v1/logs")
        return value

    @field_validator("siem_syslog_ca_file", "siem_syslog_client_cert_file",
                     "siem_syslog_client_key_file", "siem_otlp_ca_file",
                     "siem_otlp_client_cert_file", "siem_otlp_client_key_file")
    @classmethod
    def _file_exists(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_file():
            raise ValueError("names no readable file")
        return value

    @field_validator("siem_otlp_headers")
    @classmethod
    def _headers_parse(cls, value):
        if value is not None:
            parse_headers(value.get_secret_value() if isinstance(value, SecretStr) else value)
        return value

    @field_validator("siem_streams")
    @classmethod
    def _known_streams(cls, value: str) -> str:
        names = [s.strip() for s in value.split(",") if s.strip()]
        unknown = sorted(set(names) - set(STREAMS))
        if unknown or not names:
            raise ValueError(f"must list {' and/or '.join(STREAMS)} (comma-separated)")
        return ",".join(dict.fromkeys(names))

    @field_validator("siem_payload_fields")
    @classmethod
    def _payload_fields(cls, value: str) -> str:
        names = [s.strip() for s in value.split(",") if s.strip()]
        if "*" in names and len(names) > 1:
            raise ValueError("'*' (every field) stands alone")
        return ",".join(names)

    @model_validator(mode="after")
    def _client_key_needs_cert(self):
        for sink in ("syslog", "otlp"):
            if (getattr(self, f"siem_{sink}_client_key_file")
                    and not getattr(self, f"siem_{sink}_client_cert_file")):
                raise ValueError(f"SIEM_{sink.upper()}_CLIENT_KEY_FILE needs "
                                 f"SIEM_{sink.upper()}_CLIENT_CERT_FILE")
        return self

    @property
    def siem_enabled(self) -> bool:
        return bool(self.siem_syslog_url or self.siem_otlp_url)

    @property
    def siem_stream_names(self) -> tuple[str, ...]:
        return tuple(self.siem_streams.split(","))

    @property
    def siem_clear_fields(self) -> frozenset[str] | None:
        """The payload fields sent decrypted: None for every one ('*'), empty for none."""
        names = [n for n in self.siem_payload_fields.split(",") if n]
        return None if names == ["*"] else frozenset(names)
