"""Each tool call on the record: an audit event (``tool_call``: server, tool, arguments and
result in the sealed payload like message content, the asker as actor, latency and outcome),
and the per-tool counters and latency the dashboard and /metrics show."""

from __future__ import annotations

import logging

from prometheus_client import Counter, Histogram

from app.audit.chain import EventType

log = logging.getLogger(__name__)
AUDITED_RESULT_CHARS = 4000

TOOL_CALLS = Counter("wecom_bot_tool_calls", "MCP tool calls by server, tool and outcome",
                     ["server", "tool", "outcome"])
TOOL_SECONDS = Histogram("wecom_bot_tool_call_seconds", "MCP tool call latency", ["server", "tool"],
                         buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, float("inf")))


def tool_call(services, row, *, server: str, tool: str, arguments: dict, outcome: str,
              result: str = "", latency_s: float = 0.0, side_effect: bool = False) -> None:
    """``outcome``: ok, error, timeout, unavailable, malformed, refused, proposed, confirmed,
    cancelled, expired. Never fails the message: a failed write is logged (the call happened)."""
    TOOL_CALLS.labels(server[:32], tool[:64], outcome).inc()
    if latency_s:
        TOOL_SECONDS.labels(server[:32], tool[:64]).observe(latency_s)
    payload = {"message_id": row.id, "server": server, "tool": tool, "arguments": arguments,
               "result": result[:AUDITED_RESULT_CHARS], "latency_ms": int(latency_s * 1000),
               "side_effect": side_effect}
    try:
        services.audit.record(services.db, EventType.TOOL_CALL, actor=row.user_hash, outcome=outcome,
                              request_id=row.request_id, payload=payload)
    except Exception:  # noqa: BLE001 - see the docstring
        log.exception("tool call not audited message_id=%s tool=%s", row.id, tool)
