"""The deploy test: build the images, run the compose stack, talk to it as WeCom does.

    scripts/deploy_smoke.sh [--worktree] [--keep] [--upgrade-from REV]

Steps (each timed): a fresh clone of HEAD (or the working tree, --worktree); the base images and
the wheelhouse (cached under DEPLOY_CACHE); the app image and the stand-ins for the public
postgres, redis and nginx images; a self-signed certificate and a .env with fresh secrets; the
stack up with podman-compose in the compose file's order (postgres, redis and the engine
healthy; migrate run to exit 0; web, worker, beat, aibot-connection healthy; nginx healthy);
TLS 1.3 only on nginx's port; the WeCom emulator on the host verifying nginx's HTTPS callback URL
and asking questions; the answers; `audit verify`; the stack down with its volumes.
With --upgrade-from REV the stack first runs REV's code (built the same way) with data in it,
then this tree's images over the same volumes (scripts/deploy/upgrade.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from scripts.deploy import images
from scripts.deploy.relay import Relay
from scripts.deploy.stack import Stack
from scripts.deploy.wecom import Emulator

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DEPLOY_CACHE", "/var/cache/wecom-deploy"))
PROJECT = os.environ.get("DEPLOY_SMOKE_PROJECT", "wecom-smoke")
HTTPS_PORT = int(os.environ.get("DEPLOY_SMOKE_HTTPS_PORT", "18443"))
HTTP_PORT = int(os.environ.get("DEPLOY_SMOKE_HTTP_PORT", "18080"))
EMULATOR_PORT = int(os.environ.get("DEPLOY_SMOKE_EMULATOR_PORT", "18081"))
COMPOSE_FILES = ["docker-compose.yml", "docker/compose.cpu.yml"]
# The compose file's order: each stage's conditions hold before the next starts.
FIRST = ["postgres", "redis", "engine"]           # healthy (the engine loads its model meanwhile)
APP = ["web", "api", "worker", "beat", "aibot-connection"]  # after migrate exited 0; healthy
EDGE = ["nginx"]                                   # after web is healthy
QUESTIONS = (  # (employee, question): the handbook answers these
    ("zhangwei", "年假有几天？"),
    ("zhangwei", "How many days of annual leave do I get?"),
    ("lina", "报销的提交时限是多久？"),
)

TIMES: list[tuple[str, float]] = []


@contextmanager
def step(name: str):
    print(f"==> {name}", flush=True)
    start = time.monotonic()
    try:
        yield
    finally:
        took = time.monotonic() - start
        TIMES.append((name, took))
        print(f"    [{took:6.1f} s] {name}", flush=True)


def source_tree(work: Path, worktree: bool) -> Path:
    """A fresh clone of HEAD, or (--worktree) the files git would commit now."""
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    if worktree:
        files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, check=True).stdout.split(b"\0")
        for rel in filter(None, files):
            path = ROOT / rel.decode()
            if path.is_file():
                (src / rel.decode()).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, src / rel.decode())
    else:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(src)], check=True)
        subprocess.run(["git", "checkout", "--quiet", head], cwd=src, check=True)
    return src


def demo_settings(src: Path) -> dict[str, str]:
    """How the demo model reads the knowledge base (as make run sets it), from ``src``."""
    code = ("import json\ntry:\n    from demo.grounded import as_environment, demo_reading\n"
            "except ImportError:\n    from inference.demo.grounded import as_environment, demo_reading\n"
            "print(json.dumps(as_environment(demo_reading(False))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=src, text=True, capture_output=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(src)}).stdout
    return json.loads(out)


def handbooks(src: Path) -> list[tuple[Path, str]]:
    """The demo handbook's editions (English, Chinese) with their titles, as make run loads them."""
    for folder in ("demo/corpus", "inference/demo/corpus"):  # the demo package's old and new place
        if (src / folder / "company.md").is_file():
            return [(src / folder / "company.md", "星河科技员工手册 Employee Handbook"),
                    (src / folder / "company.zh.md", "星河科技员工手册（中文版）")]
    raise FileNotFoundError("the demo handbook (company.md) is not in the tree")


def write_env(src: Path, extra: dict[str, str]) -> dict[str, str]:
    """A .env for the stack: fresh secrets as make run makes them (scripts/dev_env.py), the
    emulator as WeCom's API, the stand-in images, the published ports on loopback."""
    sys.path.insert(0, str(src))
    try:
        from scripts.dev_env import dev_env
    finally:
        sys.path.remove(str(src))
    values = {k: v for k, v in dev_env(f"http://host.containers.internal:{EMULATOR_PORT}").items()
              if not k.startswith("AIBOT_")}  # no AI bot: its long connection would dial WeCom
    values.update(
        POSTGRES_PASSWORD=os.urandom(24).hex(),
        HTTPS_PORT=f"127.0.0.1:{HTTPS_PORT}", HTTP_PORT=f"127.0.0.1:{HTTP_PORT}",
        WEB_WORKERS="2", WORKER_CONCURRENCY="8", ENGINE_MAX_NUM_SEQS="8", TEMPERATURE="0",
        **demo_settings(src), **extra)
    path = src / ".env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    path.chmod(0o600)
    return values


def make_certificate(src: Path) -> Path:
    subprocess.run(["bash", "docker/nginx/make-self-signed-cert.sh", "localhost"], cwd=src,
                   check=True, capture_output=True)
    return src / "docker" / "nginx" / "certs" / "tls.crt"


def bring_up(stack: Stack, timeout_s: float) -> None:
    """The stack in the compose file's order, every condition checked (scripts/deploy/stack.py)."""
    with step("up: postgres, redis, engine (healthy)"):
        stack.up(*FIRST)
        for name, took in stack.wait_healthy(FIRST, timeout_s).items():
            print(f"    {name} healthy after {took:.0f} s")
    with step("migrate (python -m app.cli migrate, once)"):
        stack.up("migrate")
        status = stack.wait_exit("migrate", timeout_s)
        print("   ", stack.logs_tail(stack.container("migrate"), 3).replace("\n", "\n    "))
        if status != 0:
            raise RuntimeError(f"migrate exited {status}")
    with step("up: web, worker, beat, aibot-connection (healthy)"):
        stack.up(*APP)
        for name, took in stack.wait_healthy(APP, timeout_s).items():
            print(f"    {name} healthy after {took:.0f} s")
    with step("up: nginx (healthy)"):
        stack.up(*EDGE)
        stack.wait_healthy(EDGE, timeout_s)


def check_tls(cert: Path) -> None:
    """nginx speaks TLS 1.3 and refuses 1.2."""
    def handshake(version: str) -> bool:
        done = subprocess.run(["openssl", "s_client", f"-{version}", "-connect",
                               f"127.0.0.1:{HTTPS_PORT}", "-servername", "localhost",
                               "-CAfile", str(cert), "-verify_return_error", "-brief"],
                              input="", text=True, capture_output=True, timeout=30)
        return done.returncode == 0
    ok13, ok12 = handshake("tls1_3"), handshake("tls1_2")
    print(f"    TLS 1.3 handshake: {'ok' if ok13 else 'FAILED'}; TLS 1.2: {'accepted' if ok12 else 'refused'}")
    if not ok13 or ok12:
        raise RuntimeError("nginx must speak TLS 1.3 and only it")


def readyz(cert: Path) -> dict:
    import requests

    answer = requests.get(f"https://localhost:{HTTPS_PORT}/readyz", verify=str(cert), timeout=10)
    print(f"    GET https://localhost:{HTTPS_PORT}/readyz -> {answer.status_code} {answer.text.strip()}")
    answer.raise_for_status()
    return answer.json()


def load_handbook(stack: Stack, src: Path) -> None:
    """The demo's knowledge base: the handbook's editions, added in the web container (the
    admin CLI, as an operator would)."""
    for path, title in handbooks(src):
        inside = f"/tmp/{path.name}"  # noqa: S108 - in the container, removed with it
        subprocess.run(["podman", "cp", str(path), f"{stack.container('web')}:{inside}"],
                       env=stack.env, check=True)
        out = stack.exec("web", "python", "-m", "app.cli", "kb", "add", inside, "--title", title).stdout
        print(f"    {path.name}: {out.strip().splitlines()[-1] if out.strip() else 'no output'}")


def converse(emulator: Emulator, questions=QUESTIONS, timeout_s: float = 300) -> list[tuple[str, str, float]]:
    answered = []
    for user, question in questions:
        answer, took = emulator.ask(user, question, timeout_s)
        answered.append((question, answer, took))
        print(f"    Q ({user}): {question}\n    A [{took:.1f} s]: {answer.strip()[:300]}")
    return answered


def audit_verify(stack: Stack) -> str:
    done = stack.exec("web", "python", "-m", "app.cli", "audit", "verify", check=False)
    line = (done.stdout + done.stderr).strip().splitlines()[-1]
    print(f"    audit verify (exit {done.returncode}): {line}")
    if done.returncode != 0:
        raise RuntimeError("audit verify failed")
    return line


def build_images(src: Path, env: dict[str, str], tag: str) -> dict[str, str]:
    with step("base images (debootstrap, cached)"):
        images.make_bases(src, env)
    with step("wheelhouse (the lock's files, cached)"):
        images.fill_wheelhouse(src, env)
    with step(f"build {tag}"):
        images.build_app(src, tag, env)
    with step("build the stand-ins for postgres, redis, nginx"):
        standins = images.build_standins(src / "docker" / "local", env)
    for name in (tag, *standins.values()):
        print(f"    {name}: {images.size_mb(name, env):.0f} MB")
    return standins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worktree", action="store_true", help="the working tree, not a clone of HEAD")
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    parser.add_argument("--upgrade-from", metavar="REV", help="first run REV's images with data")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a stage may take")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    work = CACHE / "smoke"
    work.mkdir(parents=True, exist_ok=True)
    total = time.monotonic()
    with step("source: " + ("the working tree" if args.worktree else "a fresh clone of HEAD")):
        src = source_tree(work, args.worktree)
    tag = "localhost/wecom-glm-bot:smoke"
    standins = build_images(src, env, tag)
    if args.upgrade_from:
        from scripts.deploy import upgrade

        return upgrade.run(args, src, env, standins, tag, total)
    with step("certificate and .env"):
        cert = make_certificate(src)
        values = write_env(src, {**standins, "BOT_IMAGE": tag})
    stack = Stack(shutil.which("podman-compose") or "podman-compose", PROJECT, src, COMPOSE_FILES, env)
    stack.down(volumes=True)
    ok = False
    try:
        bring_up(stack, args.timeout)
        with step("nginx: TLS 1.3 only, /readyz over HTTPS"):
            check_tls(cert)
            readyz(cert)
        exercise(stack, src, cert, values, work)
        ok = True
    finally:
        if not args.keep:
            with step("down (containers and volumes)"):
                stack.down(volumes=True)
        report(total, ok)
    return 0 if ok else 1


def exercise(stack: Stack, src: Path, cert: Path, values: dict[str, str], work: Path,
             questions=QUESTIONS, load_kb: bool = True, admin: str = "smoke-admin") -> list:
    """The emulator against the running stack: verify, questions, answers, an admin account
    made (an audited action), the audit chain verified."""
    if load_kb:
        with step("knowledge base: the demo handbook"):
            load_handbook(stack, src)
    relay = Relay(stack.gateway(), EMULATOR_PORT, EMULATOR_PORT).start()
    emulator = Emulator(src, EMULATOR_PORT, f"https://localhost:{HTTPS_PORT}/wecom/callback",
                        cert, values, work / f"emulator-{admin}.log")
    try:
        with step("emulator: verify the callback URL through nginx"):
            verified = emulator.verify()
            print(f"    {verified}")
            if not verified.get("ok"):
                raise RuntimeError("URL verification failed")
        with step("messages and answers"):
            answered = converse(emulator, questions)
        with step("audit verify"):
            made = stack.exec("web", "python", "-m", "app.cli", "users", "create", admin,
                              "--role", "admin", "--password", os.urandom(12).hex() + "Aa1!")
            print(f"    {made.stdout.strip()}")
            audit_verify(stack)
    finally:
        emulator.stop()
        relay.stop()
    return answered


def report(total_start: float, ok: bool) -> None:
    print("\nsteps:")
    for name, took in TIMES:
        print(f"  {took:7.1f} s  {name}")
    print(f"  {time.monotonic() - total_start:7.1f} s  total ({'passed' if ok else 'FAILED'})")
