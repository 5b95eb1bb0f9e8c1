"""A Redis Cluster of the tests' own: six ``redis-server`` processes on loopback ports (three
primaries, a replica each) under a temporary directory, made one cluster by
``redis-cli --cluster create``. A fault test kills a primary and waits for its replica to take
its slots over (``cluster-node-timeout`` is 1 s here: a failover takes 2-3 s)."""

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

NODE_TIMEOUT_MS = 1000


class LocalRedisCluster:
    def __init__(self, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = NODE_TIMEOUT_MS):
        self.size = primaries * (1 + replicas)
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.dir = Path(tempfile.mkdtemp(prefix="redis-cluster-"))
        self.ports: list[int] = []
        self.bus_ports: dict[int, int] = {}
        self.procs: dict[int, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        """``REDIS_URL`` for the app: every node as a startup node (any live one is enough)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + "/"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=1)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> LocalRedisCluster:
        for binary in ("redis-server", "redis-cli"):
            if shutil.which(binary) is None:
                raise RuntimeError(f"{binary} is not installed")
        try:
            while len(self.ports) < self.size:  # the bus port is set apart (cluster-port), not port + 10000
                port, bus = free_port(), free_port()
                if port != bus and port not in self.ports and port not in self.bus_ports.values():
                    self.ports.append(port)
                    self.bus_ports[port] = bus
            for port in self.ports:
                self.start_node(port)
            subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                            "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                           check=True, capture_output=True, timeout=60)
            wait_for(self.healthy, 60, interval=0.2, what="the redis cluster to form")
        except BaseException:
            self.close()
            raise
        return self

    def start_node(self, port: int) -> None:
        """Start the node on ``port`` and wait until it answers; a node that exits first (its
        port taken, say) fails at once, with its log, instead of after the wait."""
        node_dir = self.dir / str(port)
        node_dir.mkdir(exist_ok=True)
        log = open(node_dir / "redis.log", "ab")  # noqa: SIM115 - the process owns it
        self.procs[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-port", str(self.bus_ports[port]),
             "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(self.node_timeout_ms),
             # replicas sync at once (no 5 s diskless delay), and a replica may always take over
             "--repl-diskless-sync-delay", "0", "--cluster-replica-validity-factor", "0",
             "--save", "", "--appendonly", "no", "--dir", str(node_dir)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        proc = self.procs[port]
        wait_for(lambda: proc.poll() is not None or self._pings(port), 20, what=f"redis node {port}")
        if proc.poll() is not None:
            log_text = (node_dir / "redis.log").read_text(errors="replace")[-500:]
            raise RuntimeError(f"redis node {port} exited ({proc.returncode}): {log_text}")

    def _pings(self, port: int) -> bool:
        with contextlib.suppress(redis.RedisError):
            return self.node(port).ping()
        return False

    def running(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def healthy(self) -> bool:
        """Every running node says the cluster is ok, sees every slot served, and knows each
        running node's role as the others do (a promotion has spread)."""
        try:
            for port in self.running():
                info = self.node(port).cluster("info")
                if info.get("cluster_state") != "ok" or int(info.get("cluster_slots_ok", 0)) != 16384:
                    return False
            if len(self.primaries()) != self.size // (1 + self.replicas):
                return False
            for port in self.running():  # every replica has synced with its primary
                replication = self.node(port).info("replication")
                if replication["role"] != "master" and replication.get("master_link_status") != "up":
                    return False
            return True
        except redis.RedisError:
            return False

    def slot_ranges(self, port: int | None = None) -> list[tuple[int, int, int]]:
        """(first slot, last slot, primary's port) as node ``port`` (default: a running one) sees them."""
        raw = self.node(port or self.running()[0]).execute_command("CLUSTER SLOTS")
        return [(int(entry[0]), int(entry[1]), int(entry[2][1])) for entry in raw]

    def primaries(self) -> list[int]:
        """The ports of the live primaries that serve slots, as every running node sees them."""
        seen = [{p for _, _, p in self.slot_ranges(port)} for port in self.running()]
        if any(s != seen[0] for s in seen):
            return []  # a promotion not yet known everywhere
        return sorted(seen[0] & set(self.running()))

    def primary_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot."""
        return self.primary_of_slot(int(self.node(self.running()[0]).execute_command("CLUSTER KEYSLOT", key)))

    def keys(self, pattern: str) -> list[str]:
        """SCAN on every primary (a cluster's keyspace is split among them)."""
        found = []
        for port in self.primaries():
            found += [k.decode() for k in self.node(port).scan_iter(match=pattern, count=1000)]
        return sorted(found)

    def migrate_slot(self, slot: int, to_port: int, batch: int = 10, pause_s: float = 0.01) -> int:
        """Move ``slot`` to primary ``to_port`` the way resharding does (IMPORTING/MIGRATING,
        ``MIGRATE`` a few keys at a time, then ``SETSLOT NODE`` everywhere): clients meanwhile
        get ``ASK`` for the keys moved, ``TRYAGAIN`` for a multi-key command whose keys are split,
        then ``MOVED``. Returns the keys moved."""
        source_port = self.primary_of_slot(slot)
        source, target = self.node(source_port), self.node(to_port)
        source_id, target_id = (n.execute_command("CLUSTER MYID").decode() for n in (source, target))
        target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
        moved = 0
        while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, batch):
            source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
            time.sleep(pause_s)
        for port in self.primaries():
            self.node(port).execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        return moved

    def primary_of_slot(self, slot: int) -> int:
        for start, end, port in self.slot_ranges():
            if start <= slot <= end:
                return port
        raise AssertionError(f"no primary serves slot {slot}")

    def kill(self, port: int, sig: int = signal.SIGKILL) -> None:
        """Kill one node at once (no save, no failover handshake): its replica must detect it."""
        proc = self.procs[port]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=10)

    def wait_failover(self, dead: int, timeout: float = 30.0) -> float:
        """Seconds until the cluster is ok again without ``dead`` serving slots."""
        began = time.monotonic()
        wait_for(lambda: self.healthy() and dead not in self.primaries(), timeout, interval=0.1,
                 what=f"a replica to take over from {dead}")
        return time.monotonic() - began

    def flush(self) -> None:
        for port in self.primaries():
            self.node(port).flushall()

    def close(self) -> None:
        for port in list(self.procs):
            with contextlib.suppress(Exception):
                self.kill(port)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
