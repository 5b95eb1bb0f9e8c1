"""Write ``var/dev.env`` with fresh random secrets for a local stack (never committed).

``make run`` and the tests use it when no ``.env`` is given: the secrets live in a file outside
the repository's tracked tree, made on the machine that uses them.
"""

from __future__ import annotations

import base64
import secrets
import sys
from pathlib import Path


def random_aes_key() -> str:
    """A 43-character EncodingAESKey, as the WeCom admin console makes them."""
    return base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def dev_env(api_base: str = "http://127.0.0.1:8081") -> dict[str, str]:
    return {
        "WECOM_CORP_ID": "ww" + secrets.token_hex(8),
        "WECOM_AGENT_ID": "1000002",
        "WECOM_SECRET": secrets.token_urlsafe(32),
        "WECOM_TOKEN": secrets.token_urlsafe(24),
        "WECOM_AES_KEY": random_aes_key(),
        "WECOM_API_BASE": api_base,
        "DATA_KEYS": "k1:" + base64.b64encode(secrets.token_bytes(32)).decode(),
        "BLIND_INDEX_KEY": secrets.token_urlsafe(48),
        "SECRET_KEY": secrets.token_urlsafe(48),
        # Ed25519 seed signing audit exports ('python -m app.cli audit public-key' for auditors)
        "AUDIT_EXPORT_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
        **aibot_env(),
    }


def aibot_env() -> dict[str, str]:
    """The AI bot (智能机器人): its callback's token and key, and the long connection's bot id
    and secret (the emulator plays WeCom for both; docs/aibot.md)."""
    return {
        "AIBOT_TOKEN": secrets.token_urlsafe(24),
        "AIBOT_ENCODING_AES_KEY": random_aes_key(),
        "AIBOT_NAME": "AI助手",
        "AIBOT_BOT_ID": "aib" + secrets.token_hex(8),
        "AIBOT_SECRET": secrets.token_urlsafe(32),
    }


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
    present = {line.split("=", 1)[0] for line in target.read_text().splitlines() if "=" in line}
    missing = {k: v for k, v in dev_env().items() if k not in present}
    if missing:
        with target.open("a") as out:
            out.write("".join(f"{k}={v}\n" for k, v in missing.items()))
        print(f"added {', '.join(missing)} to {target}")


if __name__ == "__main__":
    main(*sys.argv[1:])
