"""``make run``: the whole stack on this machine, with the WeCom emulator in front.

Starts, in order: migrations, the WeCom emulator (port 8081), gunicorn with the callback (8080),
a Celery worker with the beat scheduler embedded, then asks the emulator to verify the callback
URL as WeCom's console does, and prints the chat page to open. Ctrl-C stops everything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
EMULATOR_PORT = int(os.environ.get("EMULATOR_PORT", 8081))
WEB_PORT = int(os.environ.get("WEB_PORT", 8080))


def load_env_file(path: Path) -> dict[str, str]:
    values = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                values[key.strip()] = value.strip()
    return values


def stack_env() -> dict[str, str]:
    env = dict(os.environ)
    for key, value in load_env_file(ROOT / "var" / "dev.env").items():
        env.setdefault(key, value)
    env["WECOM_API_BASE"] = f"http://127.0.0.1:{EMULATOR_PORT}"
    env.setdefault("DATABASE_URL", f"sqlite:///{ROOT / 'var' / 'wecom-bot.sqlite3'}")
    env.setdefault("WEB_BIND", f"127.0.0.1:{WEB_PORT}")
    env.setdefault("SWEEP_INTERVAL_S", "10")
    # The bundled demo model is small: its answers are most faithful to the handbook greedy.
    env.setdefault("TEMPERATURE", "0")
    # Readable logs on a terminal (production keeps the JSON default); the worker's metrics
    # endpoint beside gunicorn's /metrics (docs/observability.md).
    env.setdefault("LOG_FORMAT", "text")
    env.setdefault("METRICS_PORT", "9808")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_http(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=1)
            return
        except requests.RequestException:
            time.sleep(0.3)
    raise SystemExit(f"{url} did not come up within {seconds:.0f}s")


def main() -> None:
    env = stack_env()
    os.chdir(ROOT)
    subprocess.run([sys.executable, "-m", "app.cli", "migrate"], env=env, check=True)
    callback = f"http://127.0.0.1:{WEB_PORT}/wecom/callback"
    procs = [
        subprocess.Popen([sys.executable, "-m", "app.wecom.emulator", "--host", "127.0.0.1",
                          "--port", str(EMULATOR_PORT), "--callback-url", callback], env=env),
        subprocess.Popen([str(VENV_BIN / "gunicorn"), "app:create_app()"], env=env),
        subprocess.Popen([str(VENV_BIN / "celery"), "-A", "worker.celery_app", "worker", "-B",
                          "--pool", "threads", "--concurrency", env.get("WORKER_CONCURRENCY", "8"),
                          "-Q", "chat", "--loglevel", "INFO",
                          "--schedule", str(ROOT / "var" / "celerybeat-schedule")], env=env),
    ]

    def stop(*_):
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        wait_http(f"http://127.0.0.1:{EMULATOR_PORT}/")
        wait_http(f"http://127.0.0.1:{WEB_PORT}/healthz")
        verified = requests.post(f"http://127.0.0.1:{EMULATOR_PORT}/_emulator/verify", timeout=10).json()
        print(f"callback URL verification: {verified}")
    except SystemExit:
        stop()
        raise
    print(f"\n  WeCom emulator chat page: http://127.0.0.1:{EMULATOR_PORT}/\n"
          f"  metrics: http://127.0.0.1:{WEB_PORT}/metrics (web), "
          f"http://127.0.0.1:{env['METRICS_PORT']}/metrics (worker)\n  (Ctrl-C stops the stack)\n")
    while all(proc.poll() is None for proc in procs):
        time.sleep(1)
    print("a process of the stack exited; stopping the rest", file=sys.stderr)
    stop()


if __name__ == "__main__":
    main()
