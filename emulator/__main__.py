"""``python -m emulator``: serve the emulator until interrupted."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from emulator.config import EmulatorConfig, UnsafeToRun, refuse_foreign_secrets, refuse_production
from emulator.directory import Directory
from emulator.server import create_emulator, serve


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m emulator", description=__doc__)
    p.add_argument("--host", default=env.get("EMULATOR_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(env.get("EMULATOR_PORT", "8081")))
    p.add_argument("--callback-url", default=None,
                   help="the app's /wecom/callback (default $EMULATOR_CALLBACK_URL or "
                        "http://127.0.0.1:5000/wecom/callback)")
    p.add_argument("--corp-id", default=None, help="default $WECOM_CORP_ID")
    p.add_argument("--secret", default=None, help="default $WECOM_SECRET")
    p.add_argument("--agent-id", type=int, default=None, help="default $WECOM_AGENT_ID")
    p.add_argument("--token", default=None, help="default $WECOM_TOKEN")
    p.add_argument("--aes-key", default=None, help="default $WECOM_AES_KEY (43 characters)")
    p.add_argument("--token-ttl", type=float, default=7200.0)
    p.add_argument("--no-token-reuse", action="store_true",
                   help="mint a new access_token on every gettoken (old ones stay valid)")
    p.add_argument("--retry-interval", type=float, default=5.0)
    p.add_argument("--retries", type=int, default=3)
    p.add_argument("--callback-timeout", type=float, default=5.0)
    p.add_argument("--oversize", choices=("reject", "truncate"), default="reject",
                   help="over-long text/markdown: 45002 (default) or truncate like WeCom's docs")
    p.add_argument("--aibot-callback-url", default=None,
                   help="the app's /wecom/aibot (default $EMULATOR_AIBOT_CALLBACK_URL or "
                        "http://127.0.0.1:5000/wecom/aibot); the AI bot needs $AIBOT_TOKEN and "
                        "$AIBOT_ENCODING_AES_KEY")
    p.add_argument("--aibot-poll-interval", type=float, default=1.0,
                   help="seconds between the AI bot's stream refresh callbacks")
    p.add_argument("--aibot-ws-port", type=int, default=None,
                   help="the AI bot's long connection (WebSocket) port (default "
                        "$EMULATOR_AIBOT_WS_PORT or a free one); needs $AIBOT_BOT_ID and $AIBOT_SECRET")
    p.add_argument("--directory", default=None, help="employees JSON (default: built-in)")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        refuse_production(args.host)
    except UnsafeToRun as exc:
        print(f"refusing to start the WeCom emulator: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = EmulatorConfig.from_env(
        callback_url=args.callback_url, corp_id=args.corp_id, secret=args.secret,
        agent_id=args.agent_id, token=args.token, aes_key=args.aes_key,
        host=args.host, port=args.port, token_ttl=args.token_ttl,
        token_reuse=not args.no_token_reuse, retry_interval=args.retry_interval,
        retries=args.retries, callback_timeout=args.callback_timeout, oversize=args.oversize,
        aibot_callback_url=args.aibot_callback_url, aibot_poll_interval=args.aibot_poll_interval,
        aibot_ws_port=args.aibot_ws_port,
        directory=Directory.load(args.directory) if args.directory else None,
    )
    try:
        refuse_foreign_secrets(config)
    except UnsafeToRun as exc:
        print(f"refusing to start the WeCom emulator: {exc}", file=sys.stderr)
        return 2
    app, state = create_emulator(config)
    server = serve(app, config.host, config.port)
    log = logging.getLogger("emulator")
    log.info("WeCom emulator on http://%s:%d (callbacks to %s, %d employees)",
             config.host, server.port, config.callback_url, len(config.directory.users))

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    long_connection = app.extensions["wecom_emulator_aibot_ws"]
    if long_connection.enabled:
        long_connection.start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        state.stopping.set()
        server.stop(2.0)
        app.extensions["wecom_emulator_deliverer"].join(2.0)
        app.extensions["wecom_emulator_aibot"].join(2.0)
        long_connection.stop(2.0)
        log.info("WeCom emulator stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
