"""``make run``: the whole stack on this machine, with the WeCom emulator in front.

Starts, in order: migrations, the model server (``python -m inference serve`` on 8090, holding
``MODEL_DIR`` for the worker and ``/v1``, and the demo's embedder (``models/demo-embed``) for the
knowledge base's dense retrieval, unless ``INFERENCE_BACKEND=openai`` names another server), the
handbook's two editions (English, Chinese) loaded into the knowledge base (``kb add``, left alone
when unchanged; embedded by the model server), the WeCom emulator (port 8081; the AI bot's long connection on 8082),
gunicorn with the callbacks and the admin area (8080), a second gunicorn with ``/v1`` (8083,
``API_PORT``), a Celery worker and Celery beat, the AI bot's long-connection
service (``python -m app.web.aibot_connection``, when ``var/dev.env`` has ``AIBOT_BOT_ID``), then asks
the emulator to verify the callback URLs (the app's and the AI bot's) as WeCom's console does,
and prints the chat page to open. Ctrl-C stops everything.

The processes run under ``scripts.supervisor``: a Celery worker, beat, the model server or the
AI bot's connection that dies is started again with backoff (at most 5 restarts in 5 minutes,
then the stack stops with the reason);
the emulator or gunicorn's master dying stops the stack. The worker runs at ``WORKER_NICE``
(default 10, 0 = off): on a small machine the web's acknowledgements, which WeCom waits for,
are served before background answers (bench/load.py --nice-ab measured ack p99 195 vs 354 ms
and 260 vs 2435 ms, answers' p50 unchanged; README "Measured").
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from demo.corpus import COMPANY_PATH, HANDBOOKS
from demo.grounded import DEMO_EMBEDDER, as_environment, demo_reading
from inference.embedder import read_config
from scripts import demo_tools
from scripts.supervisor import Program, Supervisor

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
EMULATOR_PORT = int(os.environ.get("EMULATOR_PORT", 8081))
AIBOT_WS_PORT = int(os.environ.get("EMULATOR_AIBOT_WS_PORT", 8082))
WEB_PORT = int(os.environ.get("WEB_PORT", 8080))
API_PORT = int(os.environ.get("API_PORT", 8083))
ENGINE_PORT = int(os.environ.get("ENGINE_PORT", 8090))
STACK_ENV = ROOT / "var" / "stack.env"


def load_env_file(path: Path) -> dict[str, str]:
    values = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                values[key.strip()] = value.strip()
    return values


HANDBOOK = COMPANY_PATH


def handbook_contact(path: Path = HANDBOOK) -> str | None:
    """Whom the bot names when the knowledge base has no answer, as the handbook says
    ("Feedback on wrong answers: 「IT服务台」 or ext. 8100 (the bot is run by IT)")."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.search(r"Feedback on wrong answers:\s*(.+?)\s*\(", text)
    return f"IT 服务台 / the IT help desk: {found.group(1)}" if found else None


def load_handbook(env: dict[str, str]) -> None:
    """The demo's knowledge base: the handbook's editions, each added once (unchanged on later
    starts)."""
    for path, title in HANDBOOKS:
        subprocess.run([sys.executable, "-m", "app.cli", "kb", "add", str(path), "--title", title],
                       env=env, check=True)


def stack_env() -> dict[str, str]:
    env = dict(os.environ)
    for key, value in load_env_file(ROOT / "var" / "dev.env").items():
        env.setdefault(key, value)
    env["WECOM_API_BASE"] = f"http://127.0.0.1:{EMULATOR_PORT}"
    # The AI bot's long connection dials the emulator's WebSocket end, not WeCom's.
    env["EMULATOR_AIBOT_WS_PORT"] = str(AIBOT_WS_PORT)
    env["AIBOT_WS_URL"] = f"ws://127.0.0.1:{AIBOT_WS_PORT}"
    # ... and the bot's image and file URLs name the emulator, the one media host allowed here.
    env["MEDIA_URL_HOSTS"] = "127.0.0.1"
    env.setdefault("DATABASE_URL", f"sqlite:///{ROOT / 'var' / 'wecom-bot.sqlite3'}")
    env.setdefault("WEB_BIND", f"127.0.0.1:{WEB_PORT}")
    env.setdefault("API_BIND", f"127.0.0.1:{API_PORT}")
    env.setdefault("SWEEP_INTERVAL_S", "10")
    # The audit chain's head copied outside the database, compared by 'audit verify' (in
    # production a path the database's administrators cannot write); checkpoints every 10
    # minutes, and a head or copy older than 30 is reported (docs/data.md).
    env.setdefault("AUDIT_HEAD_FILE", str(ROOT / "var" / "audit-head.json"))
    env.setdefault("AUDIT_CHECKPOINT_MINUTES", "10")
    env.setdefault("AUDIT_STALE_MINUTES", "30")
    # The bundled demo model is small: its answers are most faithful to the handbook greedy.
    env.setdefault("TEMPERATURE", "0")
    # 微信客服 in the demo: the emulator's customer page (/kf/) is answered (docs/kf.md).
    env.setdefault("KF_ENABLED", "true")
    # Readable logs on a terminal (production keeps the JSON default); the worker's metrics
    # endpoint beside gunicorn's /metrics (docs/observability.md).
    env.setdefault("LOG_FORMAT", "text")
    env.setdefault("METRICS_PORT", "9808")
    if env.get("INFERENCE_BACKEND", "engine") == "engine":
        # One engine process (python -m inference serve) holds the model for the worker and /v1:
        # no web process loads it, and every caller's requests share its batches. A stack
        # configured for another OpenAI-compatible server keeps it.
        env["INFERENCE_BACKEND"] = "openai"
        env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{ENGINE_PORT}/v1"
        env["OPENAI_MODEL"] = Path(env.get("MODEL_DIR", "models/demo")).name
        env["OPENAI_REPLY_START"] = "answer"  # the server sends a think part apart, never in content
        env["ENGINE_SERVED"] = "1"
    if Path(env.get("MODEL_DIR", "models/demo")).resolve() == (ROOT / "models" / "demo").resolve():
        # The bundled demo model quotes the passage that answers: it was trained on short
        # passages, about one handbook bullet each, and is shown only fairly close matches
        # (demo/grounded.py).
        embedder = read_config(ROOT / DEMO_EMBEDDER)
        dense = bool(env.get("ENGINE_SERVED")) and embedder is not None and not env.get("EMBEDDINGS_BASE_URL")
        if dense:
            # Dense retrieval with the demo's embedder, served by the same engine process
            # (demo/train_embedder.py).
            env["ENGINE_EMBEDDINGS"] = str(ROOT / DEMO_EMBEDDER)
            env["EMBEDDINGS_BASE_URL"] = env["OPENAI_BASE_URL"]
            env["EMBEDDINGS_MODEL"] = Path(DEMO_EMBEDDER).name
            if env.get("OPENAI_API_KEY"):  # the same server: the key the worker sends it
                env.setdefault("EMBEDDINGS_API_KEY", env["OPENAI_API_KEY"])
        # the demo model's reading (its thresholds over those the embedder's training chose)
        for name, value in as_environment(demo_reading(dense)).items():
            env.setdefault(name, value)
        if dense:
            for name, value in as_environment(embedder.chosen_settings()).items():
                env.setdefault(name, value)
    demo_tools.settings(env)  # the demo's MCP tools (scripts/demo_tools.py)
    contact = handbook_contact()
    if contact:
        env.setdefault("KB_FALLBACK_CONTACT", contact)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_http(url: str, seconds: float = 60, ok_only: bool = False) -> None:
    """Until `url` answers (with 200, when `ok_only`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200 or not ok_only:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{url} did not come up within {seconds:.0f}s")


def programs(env: dict[str, str]) -> list[Program]:
    """The stack's processes; the Celery worker and beat are restarted when they die."""
    callback = f"http://127.0.0.1:{WEB_PORT}/wecom/callback"
    celery = [str(VENV_BIN / "celery"), "-A", "worker.celery_app"]
    connection = [
        # the AI bot's long connection; its replicas share a Redis lease (one holds it)
        Program("aibot-connection", [sys.executable, "-m", "app.web.aibot_connection"], restart=True),
    ] if env.get("AIBOT_BOT_ID") and env.get("AIBOT_SECRET") else []
    engine = [
        Program("engine", [sys.executable, "-m", "inference", "serve", "--model", env.get("MODEL_DIR", "models/demo"),
                           "--port", str(ENGINE_PORT), "--max-num-seqs", env.get("ENGINE_MAX_NUM_SEQS", "16"),
                           *(["--embeddings", env["ENGINE_EMBEDDINGS"]] if env.get("ENGINE_EMBEDDINGS") else []),
                           "--speculative-k", env.get("ENGINE_SPECULATIVE_K", "0"),
                           *(["--max-model-len", env["ENGINE_MAX_MODEL_LEN"]] if env.get("ENGINE_MAX_MODEL_LEN") else []),
                           *(["--kv-cache-bytes", env["ENGINE_KV_CACHE_BYTES"]] if env.get("ENGINE_KV_CACHE_BYTES") else [])],
                restart=True),
    ] if env.get("ENGINE_SERVED") else []
    return [
        *engine,
        Program("emulator", [sys.executable, "-m", "emulator", "--host", "127.0.0.1",
                             "--port", str(EMULATOR_PORT), "--callback-url", callback,
                             "--aibot-callback-url", f"http://127.0.0.1:{WEB_PORT}/wecom/aibot"]),
        # gunicorn's master replaces its own dead workers; the master itself must not die.
        # Two of them: the WeCom callbacks (and admin) apart from /v1, so streams of a slow model
        # never hold the threads that answer WeCom within its 5 s (docs/deploy.md).
        *web_programs(env),
        *demo_tools.program(env),  # the demo MCP tool server on 8084
        Program("worker", [*celery, "worker", "--pool", "threads",
                           "--concurrency", env.get("WORKER_CONCURRENCY", "8"),
                           "-Q", "chat", "--loglevel", "INFO"],
                restart=True, nice=int(env.get("WORKER_NICE", "10"))),
        Program("beat", [*celery, "beat", "--loglevel", "INFO",
                         "--schedule", str(ROOT / "var" / "celerybeat-schedule")], restart=True),
        *connection,
    ]


def web_programs(env: dict[str, str]) -> list[Program]:
    """gunicorn for the callbacks, the admin area and the probes on ``WEB_BIND``, and
    gunicorn for ``/v1`` on ``API_BIND`` (no intake server there: it takes no callbacks)."""
    gunicorn = [str(VENV_BIN / "gunicorn"), "app.web.factory:create_app()"]
    return [
        Program("web", gunicorn, env={"WEB_ROLE": "web"}),
        Program("api", gunicorn, env={"WEB_ROLE": "api", "WEB_BIND": env["API_BIND"],
                                      "INTAKE_SERVER": "0",
                                      "WEB_THREADS": env.get("API_THREADS", "16")}),
    ]


def write_stack_env(env: dict[str, str], path: Path = STACK_ENV) -> None:
    """The settings the stack's services run with, for a command run beside it (``python -m
    app.cli kb add``, ``users create``): ``var/dev.env`` holds the secrets, but the model, the
    embeddings server and the demo's reading are decided here, and a document the CLI added
    without them would have no vectors. Only what differs from the caller's own environment,
    shell-quoted for ``set -a; . var/stack.env``, readable by its owner alone (it holds the
    secrets)."""
    lines = [f"{key}={shlex.quote(value)}" for key, value in sorted(env.items())
             if os.environ.get(key) != value]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("# written by make run at each start: the settings its services use\n"
                    + "\n".join(lines) + "\n")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    env = stack_env()
    os.chdir(ROOT)
    write_stack_env(env)
    subprocess.run([sys.executable, "-m", "app.cli", "migrate"], env=env, check=True)
    supervisor = Supervisor(programs(env), env=env, cwd=ROOT)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # unwinds to stop() below
    supervisor.start()
    try:
        if env.get("ENGINE_SERVED"):
            wait_http(f"http://127.0.0.1:{ENGINE_PORT}/health", seconds=300, ok_only=True)  # the model loads
        load_handbook(env)  # after the engine: it embeds the chunks when dense retrieval is on
        demo_tools.register(env)
        wait_http(f"http://127.0.0.1:{EMULATOR_PORT}/")
        wait_http(f"http://127.0.0.1:{WEB_PORT}/healthz")
        wait_http(f"http://{env['API_BIND']}/healthz")
        verified = requests.post(f"http://127.0.0.1:{EMULATOR_PORT}/_emulator/verify", timeout=10).json()
        print(f"callback URL verification: {verified}")
        if env.get("AIBOT_TOKEN"):
            verified = requests.post(f"http://127.0.0.1:{EMULATOR_PORT}/_emulator/aibot/verify", timeout=10).json()
            print(f"AI bot callback URL verification: {verified}")
        print(f"\n  WeCom emulator chat page: http://127.0.0.1:{EMULATOR_PORT}/\n"
              f"  the /v1 API: http://{env['API_BIND']}/v1\n"
              f"  metrics: http://127.0.0.1:{WEB_PORT}/metrics (web), http://{env['API_BIND']}/metrics (api), "
              f"http://127.0.0.1:{env['METRICS_PORT']}/metrics (worker)"
              + (f", http://127.0.0.1:{ENGINE_PORT}/metrics (engine)" if env.get("ENGINE_SERVED") else "")
              + f"\n  commands beside it (kb add, users create): set -a; . {STACK_ENV.relative_to(ROOT)}; set +a"
              + "\n  (Ctrl-C stops the stack)\n")
        for sig in (signal.SIGINT, signal.SIGTERM):  # from here on the loop below ends it
            signal.signal(sig, lambda *_: stopping.set())
        reason = supervisor.run(stopping)
    finally:
        supervisor.stop()
    if not stopping.is_set():
        sys.exit(f"stopping the stack: {reason}")


if __name__ == "__main__":
    main()
