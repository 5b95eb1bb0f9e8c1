"""Stand-ins for a SIEM's receivers, speaking the real protocols, and the PKI they use.

- ``make_pki``: a self-signed CA made here with ``cryptography``, a server certificate for
  127.0.0.1/localhost and a client certificate, as PEM files;
- ``SyslogReceiver``: RFC 5425 (syslog over TLS): octet-counted RFC 5424 messages, parsed
  (structured data with its escapes) and kept; it answers our close_notify with its own, as a
  receiver that read to the end does; it can require a client certificate, be stopped (an
  outage: connections refused) and started again on the same port, or read only part of a
  batch and drop the connection (a crash mid-batch);
- ``OtlpCollector``: OTLP/HTTP JSON ``POST /v1/logs`` over TLS, checking the request's shape
  and keeping each log record, or answering a status the test picks.
"""

from __future__ import annotations

import datetime as dt
import http.server
import ipaddress
import json
import re
import socket
import ssl
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


# -- the PKI -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # a CA nobody signed with: a client trusting only it must refuse the server


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(path: Path, key) -> str:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return str(path)


def _write_cert(path: Path, cert) -> str:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def _ca(common: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(_name(common))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key, ca_cert, common: str, usage, sans: list | None = None):
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("wecom-bot test CA")
    server_key, server_cert = _leaf(ca_key, ca_cert, "siem.test", ExtendedKeyUsageOID.SERVER_AUTH,
                                    [x509.DNSName("localhost"),
                                     x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client_key, client_cert = _leaf(ca_key, ca_cert, "wecom-bot exporter", ExtendedKeyUsageOID.CLIENT_AUTH)
    _, other_cert = _ca("someone else's CA")
    return Pki(
        ca=_write_cert(directory / "ca.pem", ca_cert),
        server_cert=_write_cert(directory / "server.pem", server_cert),
        server_key=_write_key(directory / "server.key", server_key),
        client_cert=_write_cert(directory / "client.pem", client_cert),
        client_key=_write_key(directory / "client.key", client_key),
        other_ca=_write_cert(directory / "other-ca.pem", other_cert),
    )


def server_context(pki: Pki, require_client_cert: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki.ca)
    return context


# -- RFC 5424 ------------------------------------------------------------------------------------------
_HEADER = re.compile(rb"^<(\d{1,3})>1 (\S+) (\S+) (\S+) (\S+) (\S+) ")


class SyslogParseError(ValueError):
    pass


def parse_5424(raw: bytes) -> dict:
    """A syslog message as its parts; ``sd``: {SD-ID: {PARAM-NAME: value}} with escapes undone."""
    match = _HEADER.match(raw)
    if not match:
        raise SyslogParseError(f"not an RFC 5424 header: {raw[:60]!r}")
    pri, stamp, host, app, procid, msgid = match.groups()
    text = raw[match.end():].decode("utf-8")
    sd: dict[str, dict[str, str]] = {}
    i = 0
    if text.startswith("-"):
        i = 1
    else:
        while i < len(text) and text[i] == "[":
            end_id = min(p for p in (text.find(" ", i), text.find("]", i)) if p != -1)
            sd_id = text[i + 1:end_id]
            params: dict[str, str] = {}
            i = end_id
            while text[i] == " ":
                eq = text.index("=", i)
                name = text[i + 1:eq]
                if text[eq + 1] != '"':
                    raise SyslogParseError("PARAM-VALUE not quoted")
                j, value = eq + 2, []
                while text[j] != '"':
                    if text[j] == "\\" and text[j + 1] in '"\\]':
                        value.append(text[j + 1])
                        j += 2
                        continue
                    if text[j] in '"]':
                        raise SyslogParseError("unescaped character in PARAM-VALUE")
                    value.append(text[j])
                    j += 1
                params[name] = "".join(value)
                i = j + 1
            if text[i] != "]":
                raise SyslogParseError("SD-ELEMENT not closed")
            sd[sd_id] = params
            i += 1
    msg = text[i + 1:] if i < len(text) and text[i] == " " else text[i:]
    return {"pri": int(pri), "timestamp": stamp.decode(), "hostname": host.decode(),
            "app": app.decode(), "procid": procid.decode(), "msgid": msgid.decode(), "sd": sd,
            "msg": msg.removeprefix("\ufeff")}


class SyslogReceiver:
    """An RFC 5425 receiver on 127.0.0.1. ``messages``: every message read, in order (parsed)."""

    def __init__(self, pki: Pki, require_client_cert: bool = False):
        self.context = server_context(pki, require_client_cert)
        self.messages: list[dict] = []
        self.connections = 0
        self.refused_handshakes = 0
        self.read_limit: int | None = None  # read this many messages of the next batch, then drop
        self.port = 0
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()

    def start(self) -> SyslogReceiver:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name="syslog-rx").start()
        return self

    @property
    def url(self) -> str:
        return f"tls://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """The receiver goes away: the port refuses, open connections are cut."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with _quiet():
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone would not)
            listener.close()
        with self._lock:
            for conn in list(self._open):
                with _quiet():
                    conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        try:
            conn = self.context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            with self._lock:
                self.refused_handshakes += 1
            raw.close()
            return
        with self._lock:
            self.connections += 1
            self._open.add(conn)
            limit, self.read_limit = self.read_limit, None
        buffer, taken = b"", 0
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:  # the sender's close_notify: everything before it is read
                    conn.unwrap()  # answer with ours: "read to the end"
                    return
                buffer += chunk
                while True:
                    space = buffer.find(b" ")
                    if space < 1 or not buffer[:space].isdigit():
                        break
                    length = int(buffer[:space])
                    if len(buffer) < space + 1 + length:
                        break
                    if limit is not None and taken >= limit:
                        # a crash mid-batch: what is left unread makes the close a reset
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return  # closed below: a reset
                    message = parse_5424(buffer[space + 1:space + 1 + length])
                    buffer = buffer[space + 1 + length:]
                    with self._lock:
                        self.messages.append(message)
                    taken += 1
        except (OSError, ssl.SSLError):
            return
        finally:
            with self._lock:
                self._open.discard(conn)
            with _quiet():
                conn.close()


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


# -- OTLP/HTTP --------------------------------------------------------------------------------------------
class OtlpCollector:
    """``POST /v1/logs`` (JSON) over TLS on 127.0.0.1. ``records``: each log record taken, as
    {"scope", "resource", "attributes" (flattened), "body", "timeUnixNano", "severityNumber"}."""

    def __init__(self, pki: Pki, require_client_cert: bool = False):
        self.context = server_context(pki, require_client_cert)
        self.records: list[dict] = []
        self.requests = 0
        self.answer_status = 200  # another status: every request is refused with it
        self.headers_seen: list[dict] = []
        self.port = 0
        self._server: http.server.ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/v1/logs"

    def start(self) -> OtlpCollector:
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802 - http.server's name
                collector._handle(self)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        server.socket = self.context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True, name="otlp-rx").start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def _handle(self, handler) -> None:
        with self._lock:
            self.requests += 1
            self.headers_seen.append(dict(handler.headers))
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length)
        if handler.path != "/v1/logs" or handler.headers.get("Content-Type") != "application/json":
            return self._reply(handler, 404 if handler.path != "/v1/logs" else 415, {})
        if self.answer_status != 200:
            return self._reply(handler, self.answer_status, {})
        try:
            records = self._flatten(json.loads(body))
        except (ValueError, KeyError, TypeError) as exc:
            return self._reply(handler, 400, {"error": str(exc)})
        with self._lock:
            self.records.extend(records)
        self._reply(handler, 200, {})

    @staticmethod
    def _reply(handler, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    @staticmethod
    def _value(value: dict):
        (kind, inner), = value.items()
        if kind == "intValue":
            return int(inner)
        if kind in ("stringValue", "boolValue", "doubleValue"):
            return inner
        raise ValueError(f"unexpected AnyValue {kind}")

    def _flatten(self, request: dict) -> list[dict]:
        """The ExportLogsServiceRequest's records; a malformed request raises (answered 400)."""
        out = []
        for resource_logs in request["resourceLogs"]:
            resource = {a["key"]: self._value(a["value"]) for a in resource_logs["resource"]["attributes"]}
            for scope_logs in resource_logs["scopeLogs"]:
                scope = scope_logs["scope"]["name"]
                for record in scope_logs["logRecords"]:
                    if not str(record["timeUnixNano"]).isdigit():
                        raise ValueError("timeUnixNano must be an integer (as a string)")
                    if record["severityNumber"] not in range(1, 25):
                        raise ValueError("severityNumber out of range")
                    out.append({"scope": scope, "resource": resource,
                                "timeUnixNano": int(record["timeUnixNano"]),
                                "severityNumber": record["severityNumber"],
                                "body": record["body"]["stringValue"],
                                "attributes": {a["key"]: self._value(a["value"])
                                               for a in record["attributes"]}})
        return out
