"""The compose stack under podman-compose, as Docker Compose would run it.

Two things Docker Compose does by itself are done here: Debian 12's podman (4.3) schedules health
checks through systemd timers, which a host without systemd lacks, so ``wait_healthy`` runs each
container's own check (``podman healthcheck run``) until it passes; and podman-compose ignores
``condition: service_healthy`` before podman 4.6, so ``up`` is called stage by stage in the
compose file's order (the caller names the stages), each stage's conditions met before the next.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path


class StackError(RuntimeError):
    """A service did not come up (or a one-shot failed); the message names it and its log's tail."""


class Stack:
    def __init__(self, podman_compose: str, project: str, workdir: Path, files: list[str],
                 env: dict[str, str]) -> None:
        self.podman_compose, self.project, self.workdir = podman_compose, project, workdir
        self.files, self.env = files, env

    # -- podman-compose --------------------------------------------------------------------------
    def compose(self, *args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
        argv = [self.podman_compose, "-p", self.project]
        for f in self.files:
            argv += ["-f", f]
        return subprocess.run([*argv, *args], cwd=self.workdir, env=self.env, check=check,
                              text=True, capture_output=capture)

    def up(self, *services: str) -> None:
        """``up -d`` for these services only (--no-deps: the stages before started theirs)."""
        self.compose("up", "-d", "--no-deps", *services, capture=True)

    def down(self, volumes: bool) -> None:
        self.compose("down", *(["-v"] if volumes else []), "-t", "30", check=False, capture=True)

    def exec(self, service: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", "exec", self.container(service), *argv], env=self.env,
                              text=True, capture_output=True, check=check)

    # -- containers ------------------------------------------------------------------------------
    def containers(self, service: str) -> list[str]:
        out = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}", "--filter",
                              f"label=io.podman.compose.project={self.project}", "--filter",
                              f"label=com.docker.compose.service={service}"],
                             env=self.env, text=True, capture_output=True, check=True).stdout
        return sorted(out.split())

    def container(self, service: str) -> str:
        names = self.containers(service)
        if not names:
            raise StackError(f"{service}: no container")
        return names[0]

    def inspect(self, name: str) -> dict:
        out = subprocess.run(["podman", "inspect", name], env=self.env, text=True,
                             capture_output=True, check=True).stdout
        return json.loads(out)[0]

    def logs_tail(self, name: str, lines: int = 30) -> str:
        done = subprocess.run(["podman", "logs", "--tail", str(lines), name], env=self.env,
                              text=True, capture_output=True)
        return (done.stdout + done.stderr).strip()

    def healthy(self, name: str) -> bool:
        """Run the container's own health check once (what Docker's scheduler would do)."""
        return subprocess.run(["podman", "healthcheck", "run", name], env=self.env,
                              capture_output=True).returncode == 0

    def wait_healthy(self, services: list[str], timeout_s: float) -> dict[str, float]:
        """Until every container of these services passes its health check; seconds each took."""
        start = time.monotonic()
        pending = {name: svc for svc in services for name in self.containers(svc)}
        missing = [s for s in services if s not in pending.values()]
        if missing:
            raise StackError(f"no container for {missing}")
        took: dict[str, float] = {}
        while pending:
            for name in list(pending):
                state = self.inspect(name)["State"]
                if not state.get("Running") and state.get("Status") == "exited":
                    raise StackError(f"{name} exited ({state.get('ExitCode')}):\n{self.logs_tail(name)}")
                if self.healthy(name):
                    took[name] = time.monotonic() - start
                    del pending[name]
            if pending and time.monotonic() - start > timeout_s:
                tails = "\n".join(f"--- {n}\n{self.logs_tail(n)}" for n in pending)
                raise StackError(f"not healthy after {timeout_s:.0f} s: {sorted(pending)}\n{tails}")
            if pending:
                time.sleep(2)
        return took

    def wait_exit(self, service: str, timeout_s: float) -> int:
        """A one-shot's exit status (``podman wait``)."""
        name = self.container(service)
        done = subprocess.run(["podman", "wait", name], env=self.env, text=True,
                              capture_output=True, timeout=timeout_s, check=True)
        return int(done.stdout.strip().splitlines()[-1])

    def gateway(self) -> str:
        """The compose network's gateway: the host, as the containers see it."""
        out = subprocess.run(["podman", "network", "inspect", f"{self.project}_default"],
                             env=self.env, text=True, capture_output=True, check=True).stdout
        return json.loads(out)[0]["subnets"][0]["gateway"]
