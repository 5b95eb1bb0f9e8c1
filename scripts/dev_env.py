"""Write ``var/dev.env`` for a local stack (never committed).

``make run`` and the tests use it when no ``.env`` is given. The app's own keys (``DATA_KEYS``,
``BLIND_INDEX_KEY``, ``SECRET_KEY``, ``AUDIT_EXPORT_KEY``) are fresh random secrets made on the
machine that uses them, in a file outside the repository's tracked tree. The secrets the app
shares with WeCom (corp secret, callback token and key, the AI bot's) are the emulator's public
demo values: the emulator stands in for WeCom here and refuses any other
(``emulator.config.refuse_foreign_secrets``), so a real deployment's secrets never reach it.
"""

from __future__ import annotations

import base64
import secrets
import sys
from pathlib import Path

from emulator.config import DEMO_SECRETS


def random_aes_key() -> str:
    """A 43-character EncodingAESKey, as the WeCom admin console makes them."""
    return base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def dev_env(api_base: str = "http://127.0.0.1:8081") -> dict[str, str]:
    return {
        "WECOM_CORP_ID": "ww" + secrets.token_hex(8),
        "WECOM_AGENT_ID": "1000002",
        **demo_secrets("WECOM_SECRET", "WECOM_TOKEN", "WECOM_AES_KEY"),
        "WECOM_API_BASE": api_base,
        # WeCom sign-in for the admin site: the emulator plays WeCom's login pages too
        "WECOM_LOGIN_ENABLED": "true",
        "WECOM_LOGIN_BASE": api_base,
        "WECOM_OAUTH_BASE": api_base,
        "DATA_KEYS": "k1:" + base64.b64encode(secrets.token_bytes(32)).decode(),
        "BLIND_INDEX_KEY": secrets.token_urlsafe(48),
        "SECRET_KEY": secrets.token_urlsafe(48),
        # Ed25519 seed signing audit exports ('python -m app.cli audit public-key' for auditors)
        "AUDIT_EXPORT_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
        # Ed25519 seed signing the asker's identity for MCP tool servers (docs/tools.md)
        "TOOLS_SIGNING_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
        **aibot_env(),
    }


def aibot_env() -> dict[str, str]:
    """The AI bot (智能机器人): its callback's token and key, and the long connection's bot id
    and secret (the emulator plays WeCom for both; docs/aibot.md)."""
    return {
        **demo_secrets("AIBOT_TOKEN", "AIBOT_ENCODING_AES_KEY"),
        "AIBOT_NAME": "AI助手",
        "AIBOT_BOT_ID": "aib" + secrets.token_hex(8),
        **demo_secrets("AIBOT_SECRET"),
    }


def demo_secrets(*names: str) -> dict[str, str]:
    """The emulator's public demo values of these shared secrets."""
    return {name: DEMO_SECRETS[name][1] for name in names}


def main(path: str = "var/dev.env") -> None:
    target = Path(path)
    if target.exists():
        add_missing(target)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(f"{k}={v}\n" for k, v in dev_env().items()))
    target.chmod(0o600)
    print(f"wrote fresh secrets to {target}")


def add_missing(target: Path) -> None:
    """Give a file made by an earlier version the variables added since (never changing one
    it has: its secrets seal the local database's rows)."""
    lines = target.read_text().splitlines()
    present = {line.split("=", 1)[0] for line in lines if "=" in line}
    missing = {k: v for k, v in dev_env().items() if k not in present}
    if missing:
        with target.open("a") as out:
            out.write("".join(f"{k}={v}\n" for k, v in missing.items()))
        print(f"added {', '.join(missing)} to {target}")
    use_demo_secrets(target)


def use_demo_secrets(target: Path) -> None:
    """An earlier version's random WeCom secrets -> the emulator's demo values (it refuses
    others). They seal nothing stored: only the callbacks' signatures and encryption."""
    lines = target.read_text().splitlines()
    changed = []
    for i, line in enumerate(lines):
        name, sep, value = line.partition("=")
        if sep and name.strip() in DEMO_SECRETS and value.strip() != DEMO_SECRETS[name.strip()][1]:
            lines[i] = f"{name.strip()}={DEMO_SECRETS[name.strip()][1]}"
            changed.append(name.strip())
    if changed:
        target.write_text("".join(f"{line}\n" for line in lines))
        print(f"{', '.join(changed)} in {target}: now the emulator's demo values")


if __name__ == "__main__":
    main(*sys.argv[1:])
