"""The emulator's settings: one dataclass, read from the same environment variables as the app.

The demo defaults below are fictional and public on purpose; a real deployment never talks to the
emulator. The app and the emulator only have to agree on them (``.env`` or the environment).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from emulator.directory import Directory

DEFAULT_CORP_ID = "ww0e1f2d3c4b5a6978"
DEFAULT_SECRET = "emulator-demo-secret-not-for-production"  # noqa: S105 - public demo value
DEFAULT_AGENT_ID = 1000002
DEFAULT_TOKEN = "emulatordemotoken"  # noqa: S105 - public demo value
DEFAULT_AES_KEY = "cWluZ2hlLXdlY29tLWVtdWxhdG9yLWRlbW8ta2V5ISE"  # 43 chars, 32 bytes decoded
# The AI bot's demo values (its callback's token and key, the long connection's secret).
DEFAULT_AIBOT_TOKEN = "emulatordemoaibottoken"  # noqa: S105 - public demo value
DEFAULT_AIBOT_AES_KEY = "cWluZ2hlLXdlY29tLWVtdWxhdG9yLWFpYm90LWtleSE"  # noqa: S105 - 32 bytes decoded
DEFAULT_AIBOT_SECRET = "emulator-demo-aibot-secret-not-for-production"  # noqa: S105 - public demo value
DEFAULT_CALLBACK_URL = "http://127.0.0.1:5000/wecom/callback"
DEFAULT_AIBOT_CALLBACK_URL = "http://127.0.0.1:5000/wecom/aibot"
DEFAULT_AIBOT_NAME = "AI助手"
# What WeCom's push servers send; the app must not depend on it, but logs and fingerprints see it.
DEFAULT_USER_AGENT = "Mozilla/4.0"


@dataclass
class EmulatorConfig:
    corp_id: str = DEFAULT_CORP_ID
    secret: str = DEFAULT_SECRET
    agent_id: int = DEFAULT_AGENT_ID
    token: str = DEFAULT_TOKEN
    aes_key: str = DEFAULT_AES_KEY
    callback_url: str = DEFAULT_CALLBACK_URL
    host: str = "127.0.0.1"
    port: int = 8081
    token_ttl: float = 7200.0
    # Real WeCom hands out the same token again while it is valid; False mints a new one per call,
    # so several valid tokens coexist (what a multi-process app sees when it refreshes early).
    token_reuse: bool = True
    retries: int = 3
    retry_interval: float = 5.0
    callback_timeout: float = 5.0
    text_limit: int = 2048
    markdown_limit: int = 4096
    # "reject" answers 45002 so a splitting bug is visible; "truncate" is what WeCom's text docs
    # describe ("超过将截断") and drops the excess bytes at a character boundary.
    oversize: str = "reject"
    max_items: int = 100_000
    user_agent: str = DEFAULT_USER_AGENT
    # The 智能机器人 (AI bot): its own token and key (no AI bot without both), where its JSON
    # callbacks go, and how often it polls an unfinished stream (WeCom: about once a second).
    aibot_token: str = ""
    aibot_aes_key: str = ""
    aibot_callback_url: str = DEFAULT_AIBOT_CALLBACK_URL
    aibot_name: str = DEFAULT_AIBOT_NAME
    aibot_id: str = "aib-emulator"
    aibot_poll_interval: float = 1.0
    aibot_stream_expiry: float = 360.0  # WeCom stops polling a stream 6 minutes after it began
    # The AI bot's long connection (aibot_ws.py): the bot id and secret a subscription must
    # carry (no long connection without both) and the WebSocket server's port (0: a free one).
    aibot_bot_id: str = ""
    aibot_secret: str = ""
    aibot_ws_port: int = 0
    directory: Directory = field(default_factory=Directory.default)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides) -> EmulatorConfig:
        env = os.environ if environ is None else environ
        values = {
            "corp_id": env.get("WECOM_CORP_ID") or DEFAULT_CORP_ID,
            "secret": env.get("WECOM_SECRET") or DEFAULT_SECRET,
            "agent_id": int(env.get("WECOM_AGENT_ID") or DEFAULT_AGENT_ID),
            "token": env.get("WECOM_TOKEN") or DEFAULT_TOKEN,
            "aes_key": env.get("WECOM_AES_KEY") or DEFAULT_AES_KEY,
            "callback_url": env.get("EMULATOR_CALLBACK_URL") or DEFAULT_CALLBACK_URL,
            "aibot_token": env.get("AIBOT_TOKEN") or "",
            "aibot_aes_key": env.get("AIBOT_ENCODING_AES_KEY") or "",
            "aibot_callback_url": env.get("EMULATOR_AIBOT_CALLBACK_URL") or DEFAULT_AIBOT_CALLBACK_URL,
            "aibot_name": env.get("AIBOT_NAME") or DEFAULT_AIBOT_NAME,
            "aibot_bot_id": env.get("AIBOT_BOT_ID") or "",
            "aibot_secret": env.get("AIBOT_SECRET") or "",
            "aibot_ws_port": int(env.get("EMULATOR_AIBOT_WS_PORT") or 0),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def public(self) -> dict:
        """What the admin API may show: everything but the secret, the token and the AES key."""
        return {
            "corp_id": self.corp_id,
            "agent_id": self.agent_id,
            "callback_url": self.callback_url,
            "token_ttl": self.token_ttl,
            "token_reuse": self.token_reuse,
            "retries": self.retries,
            "retry_interval": self.retry_interval,
            "callback_timeout": self.callback_timeout,
            "text_limit": self.text_limit,
            "markdown_limit": self.markdown_limit,
            "oversize": self.oversize,
            "max_items": self.max_items,
            "aibot": bool(self.aibot_token and self.aibot_aes_key),
            "aibot_callback_url": self.aibot_callback_url,
            "aibot_name": self.aibot_name,
            "aibot_poll_interval": self.aibot_poll_interval,
            "aibot_ws": bool(self.aibot_bot_id and self.aibot_secret),
        }


class UnsafeToRun(RuntimeError):
    """The emulator was started where it could stand in for WeCom in a real deployment."""


PRODUCTION_FLAG = "WECOM_BOT_PRODUCTION"


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_production(host: str, environ: dict[str, str] | None = None) -> None:
    """Refuse to run beside a real deployment: it accepts any access_token its own gettoken
    minted and pushes forged callbacks signed with the app's own token, so it must never be
    reachable from outside this machine nor pointed at by an app that talks to real WeCom.

    Refused: a bind address that is not loopback; ``WECOM_BOT_PRODUCTION`` set (to anything but
    0/false/no); ``WECOM_API_BASE`` naming a host that is not loopback (the app then talks to
    real WeCom, so these are production settings)."""
    env = os.environ if environ is None else environ
    if not loopback(host):
        raise UnsafeToRun(f"the emulator binds to loopback only, not {host!r}")
    if env.get(PRODUCTION_FLAG, "").strip().lower() not in ("", "0", "false", "no"):
        raise UnsafeToRun(f"{PRODUCTION_FLAG} is set: this is a production environment")
    api_base = env.get("WECOM_API_BASE", "").strip()
    if api_base and not loopback(urlsplit(api_base).hostname or ""):
        raise UnsafeToRun("WECOM_API_BASE names a real WeCom host, not this emulator")


# The secrets the emulator shares with the app, each with the one value it will run with.
DEMO_SECRETS = {
    "WECOM_SECRET": ("secret", DEFAULT_SECRET),
    "WECOM_TOKEN": ("token", DEFAULT_TOKEN),
    "WECOM_AES_KEY": ("aes_key", DEFAULT_AES_KEY),
    "AIBOT_TOKEN": ("aibot_token", DEFAULT_AIBOT_TOKEN),
    "AIBOT_ENCODING_AES_KEY": ("aibot_aes_key", DEFAULT_AIBOT_AES_KEY),
    "AIBOT_SECRET": ("aibot_secret", DEFAULT_AIBOT_SECRET),
}


def refuse_foreign_secrets(config: EmulatorConfig) -> None:
    """Refuse to run with any shared secret but the emulator's own public demo value.

    The emulator signs callbacks with the app's token and key and knows the corp secret: given
    a real deployment's secrets (copied into a shell, a ``.env`` beside production's) it could
    forge WeCom's callbacks to the real app from anywhere that reaches it. Its demo values are
    public, so an app that accepts them is a demo app (``scripts/dev_env.py`` writes them for
    ``make run``; the app's own keys stay random). An AI bot secret left empty is the AI bot off."""
    foreign = [name for name, (attr, demo) in DEMO_SECRETS.items()
               if getattr(config, attr) and getattr(config, attr) != demo]
    if foreign:
        raise UnsafeToRun(f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not the "
                          "emulator's demo value (a real deployment's secret?); the emulator runs "
                          "only with its own public demo secrets (scripts/dev_env.py writes them)")
