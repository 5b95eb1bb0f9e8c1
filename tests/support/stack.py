"""The whole stack as real processes, for integration tests.

gunicorn serves the app, a Celery worker (threads pool) and Celery beat run the worker side, the
WeCom emulator runs in-process (it stands for WeCom only), and a small OpenAI-compatible server
stands in for the model server of the ``openai`` backend. Redis and the database are the real
servers: a fresh Redis DB index and a fresh SQLite file or PostgreSQL database per stack.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import requests

from app import redis_client
from emulator import EmulatorConfig, EmulatorServer
from tests.support import postgres
from tests.support.env import make_env
from tests.support.env import redis_url as test_redis_url
from tests.support.openai_server import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG_ADMIN = postgres.ADMIN  # DATA_TEST_PG names another server

# The stacks running now: a failing test's report gets the tails of their processes' logs
# (tests/conftest.py), which is all there is to go on when a stack misbehaves only in CI.
LIVE_STACKS: set[Stack] = set()


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux's default otherwise)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    return 32768, 60999


def free_port() -> int:
    """A loopback port free now, for a server a test starts: outside the ephemeral range, so that
    no outgoing connection takes it as its source port before that server binds it (CI once lost
    a Redis Cluster node so). The kernel's own choice (bind to 0) where that range leaves none."""
    low, high = _ephemeral_ports()
    spans = [(lo, hi) for lo, hi in ((10000, low - 1), (high + 1, 65535)) if hi - lo > 1000]
    rng = random.SystemRandom()
    for _ in range(100 if spans else 0):
        lo, hi = rng.choice(spans)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", rng.randint(lo, hi)))
            except OSError:
                continue
            return sock.getsockname()[1]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def terminate_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM a server's process group, SIGKILL it if it has not gone within ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def select_rows(db_url: str, sql: str) -> list[dict]:
    """The rows of one read-only query, on a connection of its own (the stack's processes hold theirs)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(text(sql))]
    finally:
        engine.dispose()


class TempDatabase:
    """A SQLite file or a throwaway PostgreSQL database."""

    def __init__(self, kind: str, tmp: Path, pg_admin: str = PG_ADMIN):
        self.kind = kind
        self.pg_admin = pg_admin
        if kind == "sqlite":
            self.url = f"sqlite:///{tmp / 'bot.sqlite3'}"
        else:
            postgres.skip_if_opted_out()
            self.name = f"it_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(pg_admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.name}"')
            server = pg_admin.split("://", 1)[1].rsplit("/", 1)[0]
            self.url = f"postgresql+psycopg://{server}/{self.name}"

    def drop(self) -> None:
        if self.kind == "postgres":
            with psycopg.connect(self.pg_admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class Stack:
    def __init__(self, tmp: Path, db_kind: str = "sqlite", redis_db: int = 9, model_delay_s: float = 0.0,
                 worker_concurrency: int = 8, extra_env: dict | None = None,
                 redis_url: str | None = None, pg_admin: str = PG_ADMIN, directory=None,
                 model_stream_piece_delay_s: float = 0.0, emulator_options: dict | None = None,
                 worker_nice: int = 0):
        """``redis_url``/``pg_admin`` point the stack at private servers a test may restart;
        ``directory`` replaces the emulator's address book (bench/load.py's many employees);
        ``worker_nice`` runs the Celery worker at a lower CPU priority (``nice -n``)."""
        self.tmp = tmp
        self.db = TempDatabase(db_kind, tmp, pg_admin)
        self.redis_url = redis_url or test_redis_url(redis_db)
        self.redis = redis_client.from_url(self.redis_url)  # a Redis Cluster too (--redis cluster)
        self.redis.flushdb()
        broker = (extra_env or {}).get("CELERY_BROKER_URL", "")
        # a Redis broker apart from the state (the state on a cluster): no earlier stack's tasks
        self.broker_redis = (redis_client.from_url(broker)
                             if broker.startswith(("redis://", "redis+sentinel://")) and broker != self.redis_url
                             else None)
        if self.broker_redis is not None:
            self.broker_redis.flushdb()
        self.model = FakeOpenAIServer(delay_s=model_delay_s,
                                      stream_piece_delay_s=model_stream_piece_delay_s).start()
        self.web_port = free_port()
        self.callback_url = f"http://127.0.0.1:{self.web_port}/wecom/callback"
        self.env = make_env(DATABASE_URL=self.db.url, REDIS_URL=self.redis_url)
        self.env.update({
            "INFERENCE_BACKEND": "openai", "OPENAI_BASE_URL": self.model.url, "OPENAI_MODEL": "fake-glm",
            "SWEEP_INTERVAL_S": "2", "SWEEP_QUEUED_AFTER_S": "4", "CLAIM_LEASE_S": "6",
            "WEB_BIND": f"127.0.0.1:{self.web_port}", "WEB_WORKERS": "2", "WEB_THREADS": "8",
            "PYTHONUNBUFFERED": "1",
            # The fake model opens its own think part or sends it apart (GLM-4.5 behind vLLM):
            # its answers stream as they come ("auto" would hold a plain answer to its end).
            "OPENAI_REPLY_START": "answer",
            # The 👍/👎 card after each answer (app.feedback.ratings) is a second message/send: off unless
            # a test asks for it (FEEDBACK_CARDS=true), as the fault tests count those calls.
            "FEEDBACK_CARDS": "false",
        })
        self.env.update(extra_env or {})
        self.emulator = EmulatorServer(EmulatorConfig(
            corp_id=self.env["WECOM_CORP_ID"], secret=self.env["WECOM_SECRET"],
            agent_id=int(self.env["WECOM_AGENT_ID"]), token=self.env["WECOM_TOKEN"],
            aes_key=self.env["WECOM_AES_KEY"], callback_url=self.callback_url,
            retry_interval=1.0, callback_timeout=5.0,
            aibot_token=self.env.get("AIBOT_TOKEN", ""), aibot_aes_key=self.env.get("AIBOT_ENCODING_AES_KEY", ""),
            aibot_callback_url=f"http://127.0.0.1:{self.web_port}/wecom/aibot",
            aibot_name=self.env.get("AIBOT_NAME", ""),
            aibot_bot_id=self.env.get("AIBOT_BOT_ID", ""), aibot_secret=self.env.get("AIBOT_SECRET", ""),
            **({"directory": directory} if directory is not None else {}), **(emulator_options or {})))
        self.worker_concurrency = worker_concurrency
        self.worker_nice = worker_nice
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> Stack:
        """Start everything; a start that fails stops what it had started (a fixture that never
        got the stack could not, and its worker would go on consuming another run's tasks)."""
        try:
            return self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise

    def _start(self) -> Stack:
        LIVE_STACKS.add(self)
        self.emulator.start()
        self.env["WECOM_API_BASE"] = self.emulator.url
        # The AI bot's media URLs point at the emulator: its host is the one media host allowed.
        self.env.setdefault("MEDIA_URL_HOSTS", self.emulator.host)
        if self.emulator.long_connection.enabled:
            self.env["AIBOT_WS_URL"] = self.emulator.ws_url
        from app import migrate

        migrate.upgrade(self.db.url)
        self.start_process("web", [str(BIN / "gunicorn"), "app.web.factory:create_app()"])
        self.start_worker()
        self.start_process("beat", [str(BIN / "celery"), "-A", "worker.celery_app", "beat",
                                    "--loglevel", "WARNING", "-s", str(self.tmp / "beat-schedule")])
        wait_for(self._web_ready, 60, what="gunicorn")
        wait_for(self.worker_ready, 60, what="celery worker")
        return self

    def start_worker(self) -> None:
        log = self.logs.get("worker")
        self._worker_log_from = log.stat().st_size if log and log.exists() else 0
        niced = ["nice", "-n", str(self.worker_nice)] if self.worker_nice else []  # nice execs: same pid
        self.start_process("worker", [*niced, str(BIN / "celery"), "-A", "worker.celery_app", "worker",
                                      "--pool", "threads", "--concurrency", str(self.worker_concurrency),
                                      "-Q", "chat", "--loglevel", "INFO", "-n", f"it-{uuid.uuid4().hex[:6]}@%h",
                                      "--without-gossip", "--without-mingle"])

    def start_connection(self, name: str = "aibot-ws") -> None:
        """A replica of the AI bot's long-connection service (``python -m app.web.aibot_connection``)."""
        self.start_process(name, [sys.executable, "-m", "app.web.aibot_connection"])

    def start_process(self, name: str, argv: list[str]) -> None:
        log_path = self.tmp / f"{name}.log"
        self.logs[name] = log_path
        log = open(log_path, "ab")  # noqa: SIM115 - the process owns it
        self.procs[name] = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **self.env},
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=30)

    def stop(self) -> None:
        LIVE_STACKS.discard(self)
        self.stop_processes()
        self.emulator.stop()
        self.model.stop()
        self.redis.flushdb()
        if self.broker_redis is not None:
            self.broker_redis.flushdb()
        self.db.drop()

    def stop_processes(self) -> None:
        """Stop gunicorn, the worker and beat (their logs are complete afterwards)."""
        for name in list(self.procs):
            proc = self.procs[name]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for name, proc in list(self.procs.items()):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            self.procs.pop(name)

    def _web_ready(self) -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{self.web_port}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    def worker_ready(self) -> bool:
        """The latest worker (not an earlier, killed one) says it is ready."""
        with open(self.logs["worker"], "rb") as log:
            log.seek(getattr(self, "_worker_log_from", 0))
            return b" ready." in log.read()

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def log_tails(self, lines: int = 60) -> list[tuple[str, str]]:
        """(name, last ``lines`` lines) of each process's log, for a failing test's report."""
        tails = []
        for name, path in self.logs.items():
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                tails.append((f"{self.tmp.name} {name}.log", "\n".join(text)))
        return tails

    # -- talking to it -------------------------------------------------------------------------
    def emu(self, method: str, path: str, **kwargs):
        resp = requests.request(method, f"{self.emulator.url}/_emulator/{path}", timeout=10, **kwargs)
        resp.raise_for_status()
        return resp.json()

    def send(self, user: str, content: str | None = None, **fields) -> dict:
        body = {"from_user": user, **fields}
        if content is not None:
            body.setdefault("msg_type", "text")
            body["content"] = content
        return self.emu("POST", "send", json=body)

    def replies(self, user: str) -> list[str]:
        data = self.emu("GET", "messages", params={"touser": user})
        items = data["messages"] if isinstance(data, dict) else data
        # the 👍/👎 card after a model answer (app.feedback.ratings) is not a reply's text
        return [_content(item) for item in items if item.get("msgtype") != "template_card"]

    def outbox_rows(self) -> list[dict]:
        return select_rows(self.db.url,
                           "SELECT id, status, attempts, msg_type, failure_reason, chunks_sent, chunks_total "
                           "FROM inbound_messages ORDER BY id")


def _content(item: dict) -> str:
    for key in ("text", "markdown"):
        if isinstance(item.get(key), dict):
            return item[key].get("content", "")
    return item.get("content", "")
