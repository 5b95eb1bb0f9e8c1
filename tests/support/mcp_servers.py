"""MCP servers the tool tests start as real processes (the SDK's server over streamable HTTP or
stdio): the demo HR server (``emulator/mcp_server.py``) and a hostile one (``hostile_mcp.py``),
and a keypair for the bot's identity tokens."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.tools.identity import public_pem

ROOT = Path(__file__).resolve().parents[2]


def keypair(tmp_path: Path) -> tuple[str, Path]:
    """(the seed as TOOLS_SIGNING_KEY takes it, the public PEM's file)."""
    seed = os.urandom(32)
    key = Ed25519PrivateKey.from_private_bytes(seed)
    pem = tmp_path / "tools-public.pem"
    pem.write_text(public_pem(key))
    return base64.b64encode(seed).decode(), pem


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], port: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"MCP server {argv} did not listen on {port}")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
