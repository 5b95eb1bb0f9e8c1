"""A Redis primary, its replica and three Sentinels of the tests' own, on loopback ports under a
temporary directory: ``REDIS_URL=redis+sentinel://...`` and Celery's Sentinel broker run on it.
``down-after-milliseconds`` is 1 s here: a killed primary is replaced within a few seconds."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tests.support.stack import free_port, wait_for

SERVICE = "mymaster"


class LocalRedisSentinel:
    def __init__(self, sentinels: int = 3, down_after_ms: int = 1000):
        self.dir = Path(tempfile.mkdtemp(prefix="redis-sentinel-"))
        self.data_ports = [free_port(), free_port()]  # primary, replica
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.down_after_ms = down_after_ms
        self.procs: dict[int, subprocess.Popen] = {}

    def url(self, db: int = 0) -> str:
        return ("redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
                + f"/{SERVICE}/{db}")

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=1)

    def start(self) -> LocalRedisSentinel:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")
        try:
            primary, replica = self.data_ports
            self._spawn(primary, [])
            self._spawn(replica, ["--replicaof", "127.0.0.1", str(primary)])
            for port in self.sentinel_ports:
                conf = self.dir / f"sentinel-{port}.conf"  # Sentinel rewrites its file: one each
                conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                                f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n"
                                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                                f"sentinel failover-timeout {SERVICE} 5000\n")
                self._spawn(port, [], conf=conf)
            wait_for(self.healthy, 60, interval=0.2, what="the sentinels to agree")
        except BaseException:
            self.close()
            raise
        return self

    def _spawn(self, port: int, args: list[str], conf: Path | None = None) -> None:
        log = open(self.dir / f"{port}.log", "ab")  # noqa: SIM115 - the process owns it
        argv = (["redis-server", str(conf), "--sentinel"] if conf else
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--repl-diskless-sync-delay", "0", "--dir", str(self.dir),
                 "--dbfilename", f"dump-{port}.rdb", *args])
        self.procs[port] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        wait_for(lambda: self._pings(port), 20, what=f"redis {port}")

    def _pings(self, port: int) -> bool:
        with contextlib.suppress(redis.RedisError):
            return self.node(port).ping()
        return False

    def primary(self) -> int | None:
        """The primary's port if every Sentinel names the same one."""
        seen = set()
        for port in self.sentinel_ports:
            try:
                addr = self.node(port).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            except redis.RedisError:
                return None
            seen.add(int(addr[1]) if addr else None)
        return seen.pop() if len(seen) == 1 else None

    def healthy(self) -> bool:
        """The Sentinels agree on a live primary, know each other and a synced replica."""
        primary = self.primary()
        if primary is None or self.procs[primary].poll() is not None:
            return False
        try:
            for port in self.sentinel_ports:
                state = self.node(port).sentinel_master(SERVICE)  # parsed by redis-py
                if state["num-other-sentinels"] < len(self.sentinel_ports) - 1 or \
                        state["num-slaves"] < 1 or state.get("is_sdown"):
                    return False
            replicas = [p for p in self.data_ports if p != primary and self.procs[p].poll() is None]
            return all(self.node(p).info("replication").get("master_link_status") == "up" for p in replicas)
        except redis.RedisError:
            return False

    def kill(self, port: int) -> None:
        proc = self.procs[port]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def wait_failover(self, dead: int, timeout: float = 60.0) -> float:
        began = time.monotonic()
        wait_for(lambda: (p := self.primary()) is not None and p != dead and self.procs[p].poll() is None,
                 timeout, interval=0.1, what=f"the Sentinels to promote a replica of {dead}")
        return time.monotonic() - began

    def close(self) -> None:
        for port in list(self.procs):
            with contextlib.suppress(Exception):
                self.kill(port)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
