"""WeCom's side of the deploy test: the emulator on the host, its callbacks through nginx.

The emulator (``python -m emulator``, loopback only) posts every callback to nginx's HTTPS URL,
trusting the stack's self-signed certificate (REQUESTS_CA_BUNDLE); the app answers through
WECOM_API_BASE, which the relay (scripts/deploy/relay.py) carries to the emulator's port.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import requests


class Emulator:
    def __init__(self, src: Path, port: int, callback_url: str, ca_file: Path,
                 wecom_env: dict[str, str], log_path: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in wecom_env.items() if k.startswith("WECOM_") and k != "WECOM_API_BASE"}
        env.update(PATH="/usr/bin:/bin", REQUESTS_CA_BUNDLE=str(ca_file), PYTHONUNBUFFERED="1")
        self._log = log_path.open("w")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "emulator", "--host", "127.0.0.1", "--port", str(port),
             "--callback-url", callback_url], cwd=src, env=env, stdout=self._log,
            stderr=subprocess.STDOUT)
        self._wait_up()

    def _wait_up(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the emulator exited ({self._proc.returncode}); see {self._log.name}")
            try:
                if requests.get(f"{self.url}/_emulator/health", timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise RuntimeError("the emulator did not start")

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()

    def verify(self) -> dict:
        """WeCom console's 'save the callback URL': a signed GET echoed back through nginx."""
        return requests.post(f"{self.url}/_emulator/verify", timeout=30).json()

    def ask(self, user: str, question: str, timeout_s: float) -> tuple[str, float]:
        """Send a text message as ``user``; the bot's first reply after it (text or markdown,
        read from the user's conversation, in sequence order) and the seconds it took."""
        view = f"{self.url}/_emulator/conversation"
        since = requests.get(view, params={"userid": user}, timeout=10).json().get("last_seq") or 0
        start = time.monotonic()
        sent = requests.post(f"{self.url}/_emulator/send", timeout=30,
                             json={"from_user": user, "msg_type": "text", "content": question})
        sent.raise_for_status()
        while time.monotonic() - start < timeout_s:
            items = requests.get(view, params={"userid": user, "since": since},
                                 timeout=10).json()["items"]
            asked = next((i["seq"] for i in items if "touser" not in i and i.get("content") == question), None)
            answers = [i for i in items if asked is not None and i["seq"] > asked
                       and i.get("touser") and i["msgtype"] in ("text", "markdown")]
            if answers:
                return str(answers[0]["content"]), time.monotonic() - start
            time.sleep(0.5)
        attempts = requests.get(f"{self.url}/_emulator/callbacks", timeout=10).json()
        raise RuntimeError(f"no answer to {question!r} within {timeout_s:.0f} s; callbacks: "
                           f"{attempts.get('deliveries')}")
