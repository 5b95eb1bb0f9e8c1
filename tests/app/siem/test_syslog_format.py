"""RFC 5424 messages and RFC 6587 octet-counting frames as the syslog sink writes them, read back
by the test receiver's strict parser."""

from __future__ import annotations

from datetime import UTC, datetime

from app.siem.records import Record
from app.siem.syslog import SyslogFormat, frame, param_value, sd_name
from tests.support.siem_receivers import parse_5424

AT = datetime(2026, 12, 8, 2, 0, 0, 123456, tzinfo=UTC)


def form(max_bytes: int = 8192) -> SyslogFormat:
    return SyslogFormat(13, "32473", "bot host-1", "wecom-bot", max_bytes)


def test_escapes_and_names_survive_a_strict_parser():
    record = Record("audit", 7, AT, "admin_change", True, "audit seq=7 admin_change ok",
                    {"seq": 7, "actor": 'ad"min]\\x', "payload_sealed": "k1:AAAA"},
                    {"a key=with]odd\"chars and more than thirty-two characters": "值 ] \" \\",
                     "count": "3"})
    raw = form().message(record)
    parsed = parse_5424(raw)
    assert parsed["pri"] == 13 * 8 + 4  # warning
    assert parsed["timestamp"] == "2026-12-08T02:00:00.123456Z"
    assert parsed["hostname"] == "bothost-1" and parsed["msgid"] == "admin_change"
    assert parsed["sd"]["audit@32473"]["actor"] == 'ad"min]\\x'
    payload = parsed["sd"]["payload@32473"]
    assert payload["count"] == "3"
    (odd_name,) = [n for n in payload if n != "count"]
    assert len(odd_name) == 32 and not set('= ]"') & set(odd_name)
    assert payload[odd_name] == '值 ] " \\'
    assert parsed["msg"] == "audit seq=7 admin_change ok"


def test_frames_are_octet_counted_in_bytes():
    message = "<109>1 - - - - - - 你好".encode()
    assert frame(message) == str(len(message)).encode() + b" " + message
    assert sd_name("") == "_" and param_value("]") == "\\]"


def test_a_long_message_drops_the_sealed_payload_first_then_the_clear_fields():
    big = "x" * 3000
    record = Record("audit", 1, AT, "message_received", False, "audit seq=1 message_received ok",
                    {"seq": 1, "payload_sealed": big}, {"note": "y" * 500})
    parsed = parse_5424(form(max_bytes=2048).message(record))
    assert "payload_sealed" not in parsed["sd"]["audit@32473"]
    assert parsed["sd"]["audit@32473"]["truncated"] == "payload_sealed"
    assert parsed["sd"]["payload@32473"]["note"] == "y" * 500
    record = Record("audit", 1, AT, "message_received", False, "s", {"seq": 1, "payload_sealed": big},
                    {"note": "y" * 3000})
    raw = form(max_bytes=2048).message(record)
    parsed = parse_5424(raw)
    assert len(raw) <= 2048 and "payload@32473" not in parsed["sd"]
    assert parsed["sd"]["audit@32473"]["truncated"] == "payload_sealed,payload"
