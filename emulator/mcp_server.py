"""The demo's MCP tool server (the SDK's server, streamable HTTP or stdio): leave balance,
expense claim status and booking a meeting room, over the emulator's directory with fake HR data.

It trusts nothing the model wrote about who is asking: every call must carry the bot's identity
token (``Authorization: Bearer`` over HTTP, the request's ``_meta`` over stdio), signed with the
key whose public half it is given, for this server (``aud``), unexpired; it answers only about
the token's bearer. ``python -m emulator.mcp_server --port 8084 --public-key PEM_FILE``.
"""

from __future__ import annotations

import argparse
import hashlib
import threading
from datetime import datetime, timedelta

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from emulator.directory import Directory
from emulator.tool_identity import (
    IDENTITY_META_KEY,
    Caller,
    Refused,
    bearer,
    caller_of,
    load_public_key,
)

ROOMS = ("A101", "A102", "B201")


def _leave_of(userid: str) -> dict:
    """Fake but stable HR data per employee."""
    seed = int(hashlib.sha256(userid.encode()).hexdigest()[:8], 16)
    return {"annual_total": 10 + seed % 6, "annual_used": seed % 5, "sick_left": 5 + seed % 3}


def _claims_of(userid: str) -> list[dict]:
    seed = int(hashlib.sha256(("claim" + userid).encode()).hexdigest()[:8], 16)
    states = ("审批中", "已批准，待打款", "已打款")
    return [{"id": f"EX-{1000 + seed % 9000 + i}", "amount": 100 + (seed >> i) % 2000,
             "status": states[(seed >> (2 * i)) % 3]} for i in range(2)]


class HrData:
    """The directory and the bookings (in memory: the demo's)."""

    def __init__(self, directory: Directory | None = None):
        self.directory = directory or Directory.default()
        self.bookings: list[dict] = []
        self.lock = threading.Lock()

    def name_of(self, userid: str) -> str:
        user = self.directory.user(userid) if hasattr(self.directory, "user") else None
        return (user or {}).get("name") or userid


def build_server(public_key_text: str, *, audience: str = "demo", issuer: str = "wecom-bot",
                 data: HrData | None = None) -> MCPServer:
    public_key = load_public_key(public_key_text)
    data = data or HrData()
    mcp = MCPServer("demo-hr", instructions="Leave, expenses and meeting rooms for the employee the "
                                            "identity token names.")

    def asker(ctx: Context) -> Caller:
        token = bearer((ctx.headers or {}).get("authorization"))
        if not token:
            token = str((ctx.request_context.meta or {}).get(IDENTITY_META_KEY) or "")
        try:
            return caller_of(token, public_key, issuer=issuer, audience=audience)
        except Refused as exc:
            raise ToolError(f"unauthorized: {exc}") from None

    read_only = ToolAnnotations(read_only_hint=True)

    @mcp.tool(description="查询提问员工本人的年假和病假余额 (the asker's leave balance)", annotations=read_only)
    def leave_balance(ctx: Context) -> str:
        who = asker(ctx)
        leave = _leave_of(who.user_id)
        left = leave["annual_total"] - leave["annual_used"]
        return (f"{data.name_of(who.user_id)}：今年年假共 {leave['annual_total']} 天，已休 "
                f"{leave['annual_used']} 天，还剩 {left} 天；病假还剩 {leave['sick_left']} 天。")

    @mcp.tool(description="查询提问员工本人的报销单状态 (the asker's expense claims)", annotations=read_only)
    def expense_claim_status(ctx: Context, claim_id: str = "") -> str:
        who = asker(ctx)
        claims = [c for c in _claims_of(who.user_id) if not claim_id or c["id"] == claim_id]
        if not claims:
            return f"没有找到报销单 {claim_id}。"
        return "；".join(f"{c['id']}（{c['amount']} 元）：{c['status']}" for c in claims) + "。"

    @mcp.tool(description="为提问员工预订会议室 (books a meeting room for the asker)",
              annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    def book_meeting_room(ctx: Context, start: str, duration_minutes: int = 60, room: str = "") -> str:
        who = asker(ctx)
        try:
            begin = datetime.fromisoformat(start)
        except ValueError:
            raise ToolError("start must be an ISO time, e.g. 2026-12-08T14:00+08:00") from None
        if not 15 <= int(duration_minutes) <= 480:
            raise ToolError("duration_minutes must be 15 to 480")
        end = begin + timedelta(minutes=int(duration_minutes))
        with data.lock:
            for candidate in ([room] if room else ROOMS):
                taken = any(b["room"] == candidate and b["start"] < end and begin < b["end"]
                            for b in data.bookings)
                if not taken and candidate in ROOMS:
                    data.bookings.append({"room": candidate, "start": begin, "end": end,
                                          "userid": who.user_id})
                    return (f"已为 {data.name_of(who.user_id)} 预订 {candidate} 会议室："
                            f"{begin:%m月%d日 %H:%M}–{end:%H:%M}。")
        raise ToolError("那个时间没有空闲的会议室")

    return mcp


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8084)
    parser.add_argument("--public-key", required=True, help="PEM file of the bot's TOOLS_SIGNING_KEY's public half")
    parser.add_argument("--audience", default="demo", help="the name the server is registered under")
    parser.add_argument("--stdio", action="store_true", help="serve on stdin/stdout instead of HTTP")
    args = parser.parse_args(argv)
    with open(args.public_key) as f:
        server = build_server(f.read(), audience=args.audience)
    if args.stdio:
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":
    main()
