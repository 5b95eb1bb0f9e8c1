"""The images the deploy test runs, built where no registry is reachable (docs/deploy.md).

The bases come from docker/base/make-base.sh (debootstrap, cached), the Python packages from
docker/wheelhouse.sh (the lock's files, cached); each build is podman's, with the Dockerfiles of
the tree it builds. Public images the compose file names by digest are replaced by the stand-ins
of docker/local/ (POSTGRES_IMAGE, REDIS_IMAGE, NGINX_IMAGE).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

APP_BASE = "localhost/wecom-bot-base:bookworm"
SERVICES_BASE = "localhost/wecom-bot-services:trixie"
STANDINS = {  # compose variable -> (Dockerfile under docker/local/, tag)
    "POSTGRES_IMAGE": ("postgres.Dockerfile", "localhost/wecom-bot-postgres:local"),
    "REDIS_IMAGE": ("redis.Dockerfile", "localhost/wecom-bot-redis:local"),
    "NGINX_IMAGE": ("nginx.Dockerfile", "localhost/wecom-bot-nginx:local"),
}


def run(argv: list[str], cwd: Path, env: dict[str, str], quiet: bool = True) -> str:
    """Run a build step at low priority (the machine is shared); its output only if it fails."""
    done = subprocess.run(["nice", "-n", "10", *argv], cwd=cwd, env=env, text=True,
                          capture_output=quiet)
    if done.returncode != 0:
        tail = "\n".join(((done.stdout or "") + (done.stderr or "")).splitlines()[-40:])
        raise RuntimeError(f"{' '.join(argv[:3])} ... failed ({done.returncode}):\n{tail}")
    return done.stdout or ""


def make_bases(src: Path, env: dict[str, str]) -> None:
    for flavor in ("app", "services"):
        print("   ", run(["bash", "docker/base/make-base.sh", flavor], src, env).strip())


def fill_wheelhouse(src: Path, env: dict[str, str]) -> None:
    print("   ", run(["bash", "docker/wheelhouse.sh"], src, env).strip().splitlines()[-1])


def build_app(src: Path, tag: str, env: dict[str, str]) -> None:
    """The CPU image (web, worker, beat, migrate, and the engine on CPU) from ``src``'s tree."""
    run(["podman", "build", "--format", "docker", "--build-arg", f"BASE_IMAGE={APP_BASE}",
         "-f", "docker/Dockerfile.cpu", "-t", tag, "."], src, env)


def build_standins(dockerfiles: Path, env: dict[str, str]) -> dict[str, str]:
    """The stand-ins for the public postgres, redis and nginx images; compose variable -> tag."""
    for dockerfile, tag in STANDINS.values():
        run(["podman", "build", "--build-arg", f"SERVICES_BASE={SERVICES_BASE}", "-f",
             dockerfile, "-t", tag, "."], dockerfiles, env)
    return {name: tag for name, (_, tag) in STANDINS.items()}


def size_mb(tag: str, env: dict[str, str]) -> float:
    out = subprocess.run(["podman", "image", "inspect", tag], env=env, text=True,
                         capture_output=True, check=True).stdout
    return json.loads(out)[0]["Size"] / 1e6
