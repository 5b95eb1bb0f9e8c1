"""A local WeCom (企业微信) for the demo and the end-to-end tests.

It plays both sides the app talks to: WeCom's HTTP API (``/cgi-bin/gettoken``, ``message/send``,
``user/get``, ``department/list``) and WeCom's callbacks to ``/wecom/callback`` (encrypted,
signed, retried when unanswered), plus admin endpoints under ``/_emulator/`` and a chat page.

    python -m emulator --port 8081 --callback-url http://127.0.0.1:5000/wecom/callback

In tests: ``with EmulatorServer(EmulatorConfig(...)) as emu: emu.url``.
"""

from emulator.config import EmulatorConfig
from emulator.directory import Directory
from emulator.server import EmulatorServer, create_emulator, run_in_thread
from emulator.state import EmulatorState, Fault

__all__ = ["Directory", "EmulatorConfig", "EmulatorServer", "EmulatorState", "Fault",
           "create_emulator", "run_in_thread"]
