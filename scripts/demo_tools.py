"""The demo's MCP tool server in ``make run`` (emulator/mcp_server.py on ``MCP_DEMO_PORT``,
8084): its public key written from ``TOOLS_SIGNING_KEY``, the server registered as ``demo`` and
its three tools allowed for everyone (docs/tools.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scripts.supervisor import Program

ROOT = Path(__file__).resolve().parent.parent
PORT = int(os.environ.get("MCP_DEMO_PORT", 8084))
PUBLIC_KEY = ROOT / "var" / "tools-public.pem"
TOOLS = ("leave_balance", "expense_claim_status", "book_meeting_room")


def settings(env: dict[str, str]) -> None:
    """Tools on, and the demo model's keyword planner (it cannot call tools itself)."""
    env.setdefault("TOOLS_ENABLED", "true")
    env.setdefault("TOOLS_PLANNER", "intent")


def program(env: dict[str, str]) -> list[Program]:
    """The demo server, when tools are on and a signing key is set."""
    if not program_wanted(env):
        return []
    from app.audit.signing import private_key_from_text
    from app.tools.identity import public_pem

    PUBLIC_KEY.parent.mkdir(parents=True, exist_ok=True)
    PUBLIC_KEY.write_text(public_pem(private_key_from_text(env["TOOLS_SIGNING_KEY"])))
    return [Program("mcp-demo", [sys.executable, "-m", "emulator.mcp_server", "--port", str(PORT),
                                 "--public-key", str(PUBLIC_KEY)], restart=True)]


def register(env: dict[str, str]) -> None:
    """Register the demo server once and allow its tools for everyone (each start: idempotent)."""
    if not program_wanted(env):
        return
    cli = [sys.executable, "-m", "app.cli", "tools"]
    subprocess.run([*cli, "add", "demo", f"http://127.0.0.1:{PORT}/mcp"], env=env, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # refused when registered
    for tool in TOOLS:
        subprocess.run([*cli, "allow", "demo", tool, "--departments", "all"], env=env, check=True,
                       stdout=subprocess.DEVNULL)


def program_wanted(env: dict[str, str]) -> bool:
    return env.get("TOOLS_ENABLED", "").lower() in ("1", "true", "yes") and bool(env.get("TOOLS_SIGNING_KEY"))
