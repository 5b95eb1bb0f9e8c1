"""Calls to one MCP server with the official SDK: list its tools, call one.

A session per operation: a call's identity token lives ~60 s and names one asker, so a
connection is never shared between askers or kept past its token. Every operation is bounded
(``timeout_s``) and every failure becomes a ``ToolFailure`` with a short kind the notice and the
audit use: ``unavailable`` (cannot connect), ``timeout``, ``error`` (the tool said it failed),
``malformed`` (what came back is not MCP).
"""

from __future__ import annotations

import json
import shlex
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import httpx2
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client

from app.tools.identity import IDENTITY_META_KEY
from app.tools.registry import Server

TRUNCATED = "\n…[truncated: the tool returned {total} characters, {kept} are shown]"


class ToolFailure(RuntimeError):
    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass(frozen=True)
class ListedTool:
    name: str
    description: str
    input_schema: dict
    read_only: bool

    def as_dict(self) -> dict:
        return {"name": self.name, "description": self.description,
                "input_schema": self.input_schema, "read_only": self.read_only}


@dataclass(frozen=True)
class CallResult:
    text: str  # what the tool said, cut to max_chars
    is_error: bool
    truncated: bool
    chars: int  # before the cut


@asynccontextmanager
async def _session(server: Server, token: str | None, timeout_s: float):
    if server.transport == "http":
        headers = dict(server.secrets)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with (httpx2.AsyncClient(headers=headers, timeout=timeout_s) as client,
                    streamable_http_client(server.target, http_client=client) as (read, write),
                    ClientSession(read, write, read_timeout_seconds=timeout_s) as session):
            yield session
    else:
        argv = shlex.split(server.target)
        params = StdioServerParameters(command=argv[0], args=argv[1:],
                                       env={**get_default_environment(), **server.secrets})
        async with (stdio_client(params) as (read, write),
                    ClientSession(read, write, read_timeout_seconds=timeout_s) as session):
            yield session


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the task groups' exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _failure(exc: BaseException) -> ToolFailure:
    exc = _leaf(exc)
    if isinstance(exc, ToolFailure):
        return exc
    if isinstance(exc, TimeoutError):
        return ToolFailure("timeout")
    if isinstance(exc, httpx2.TransportError | ConnectionError | OSError):
        return ToolFailure("unavailable", type(exc).__name__)
    if isinstance(exc, httpx2.HTTPStatusError):
        return ToolFailure("unavailable", f"HTTP {exc.response.status_code}")
    return ToolFailure("malformed", type(exc).__name__)


def _run(operation, timeout_s: float):
    async def bounded():
        with anyio.fail_after(timeout_s):
            return await operation()
    try:
        return anyio.run(bounded)
    except Exception as exc:  # noqa: BLE001 - every failure of a foreign server is classified
        raise _failure(exc) from exc


def list_tools(server: Server, timeout_s: float) -> list[ListedTool]:
    async def operation():
        async with _session(server, None, timeout_s) as session:
            await session.initialize()
            listed = await session.list_tools()
        tools = []
        for tool in listed.tools:
            hints = tool.annotations
            tools.append(ListedTool(tool.name, (tool.description or "")[:1024],
                                    tool.input_schema or {"type": "object", "properties": {}},
                                    bool(hints and getattr(hints, "read_only_hint", False))))
        return tools
    return _run(operation, timeout_s)


def _text_of(result) -> str:
    parts = []
    for item in result.content or []:
        if getattr(item, "type", "") == "text":
            parts.append(item.text)
        else:
            parts.append(f"[{getattr(item, 'type', 'content')} omitted]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def call_tool(server: Server, tool: str, arguments: dict, token: str, timeout_s: float,
              max_chars: int) -> CallResult:
    """Call ``tool`` as the token's bearer: the token in the Authorization header (HTTP) or the
    request's ``_meta`` (stdio, and HTTP too, for a server that reads it there)."""
    async def operation():
        async with _session(server, token, timeout_s) as session:
            await session.initialize()
            return await session.call_tool(tool, arguments, read_timeout_seconds=timeout_s,
                                           meta={IDENTITY_META_KEY: token})
    result = _run(operation, timeout_s)
    text = _text_of(result)
    total = len(text)
    if total > max_chars:
        text = text[:max_chars] + TRUNCATED.format(total=total, kept=max_chars)
    return CallResult(text, bool(result.is_error), total > max_chars, total)
