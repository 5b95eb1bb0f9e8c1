"""Private Redis and PostgreSQL servers that a fault test may stop and restart.

The shared servers on 6379/5432 belong to everyone, so a test that restarts a server runs its
own: a redis-server without persistence (a restart loses every queued task, as a real one
without AOF does) and a PostgreSQL cluster made with initdb in a temporary directory, run as the
``postgres`` user when the tests run as root (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support import postgres
from tests.support.stack import free_port, wait_for


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class PrivateRedis:
    """redis-server on a free port; ``restart()`` keeps the port and loses the data."""

    def __init__(self):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="faults-redis-"))
        self.proc: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> PrivateRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - the process owns it
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: _listening(self.port), 20, what="private redis")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None
        wait_for(lambda: not _listening(self.port), 10, what="private redis to stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    return Path(found[-1]).parent


class PrivatePostgres:
    """A throwaway PostgreSQL cluster (trust auth) on a free port; stop/start keep the data."""

    def __init__(self):
        postgres.skip_if_opted_out()
        self.bin = _pg_bin()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="faults-pg-"))
        self.data = self.dir / "data"
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bin / tool), *args]
        if self.as_postgres:
            argv = ["su", "postgres", "-s", "/bin/sh", "-c",
                    " ".join(_quote(a) for a in argv)]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=120)

    def start(self) -> PrivatePostgres:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "pg.log"), "-o", options,
                  "-w", "-t", "60", "start")
        wait_for(lambda: _listening(self.port), 30, what="private postgres")
        return self

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        wait_for(lambda: not _listening(self.port), 20, what="private postgres to stop")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def settle(seconds: float) -> None:
    """Let in-flight work land before counting (the emulator's answers arrive asynchronously)."""
    time.sleep(seconds)
