"""The upgrade run (``scripts/deploy_smoke.sh --upgrade-from REV``): the stack at REV's code
with data in it, then at this tree's images over the same volumes.

REV's image is built the same way as this tree's (its app/, worker/, inference/, migrations/
and models/ with this tree's Dockerfile, lock and wheelhouse: an older Dockerfile may not build
where no registry is reachable), and each release runs under its own compose files, as an
operator's ``git pull && docker compose up -d`` switches both at once (REV's compose file names
its images by tag: those tags are given, on loopback's ``localhost/`` prefix, to REV's image and
the stand-ins, which podman finds for the short names). The same project name keeps the volumes
and the network. Shown: the schema
revision before and after and migrate's log (the upgrade runs once, in migrate), the rows kept
(messages, admin users, knowledge base), the audit chain verifying across the upgrade, and a
question answered by the new images.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

from scripts.deploy import images, smoke
from scripts.deploy.stack import Stack

BUILD_FILES = ("docker/Dockerfile.cpu", "docker/requirements.lock", ".dockerignore")
COUNTED = ("inbound_messages", "admin_users", "kb_documents", "audit_events")


def old_tree(rev: str, src: Path, work: Path) -> Path:
    """REV's files (git archive), with this tree's build files and wheelhouse over them."""
    old = work / f"old-{rev}"
    shutil.rmtree(old, ignore_errors=True)
    old.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=smoke.ROOT, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(old, filter="data")
    for rel in BUILD_FILES:
        (old / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, old / rel)
    shutil.copytree(src / "docker" / "wheelhouse", old / "docker" / "wheelhouse",
                    copy_function=_link, dirs_exist_ok=True)
    return old


def _link(source: str, target: str) -> None:
    try:
        Path(target).unlink(missing_ok=True)
        Path(target).hardlink_to(source)
    except OSError:
        shutil.copy2(source, target)


def psql(stack: Stack, sql: str) -> str:
    return subprocess.run(["podman", "exec", stack.container("postgres"), "psql", "-U", "bot",
                           "-d", "bot", "-Atc", sql], env=stack.env, text=True,
                          capture_output=True, check=True).stdout.strip()


def snapshot(stack: Stack) -> dict[str, str]:
    state = {"alembic_version": psql(stack, "SELECT version_num FROM alembic_version")}
    for table in COUNTED:
        state[table] = psql(stack, f"SELECT count(*) FROM {table}")  # noqa: S608 - fixed names
    state["users"] = psql(stack, "SELECT string_agg(name, ',' ORDER BY name) FROM admin_users")
    return state


# The tags an older compose file names (before the digests and *_IMAGE): given to the stand-ins.
OLD_TAGS = {"POSTGRES_IMAGE": "localhost/postgres:17", "REDIS_IMAGE": "localhost/redis:7-alpine",
            "NGINX_IMAGE": "localhost/nginx:1.27-alpine"}


def write_values(tree: Path, values: dict[str, str]) -> None:
    (tree / ".env").write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    (tree / ".env").chmod(0o600)


def old_stack(old: Path, src: Path, values: dict[str, str], old_tag: str, standins: dict[str, str],
              env: dict[str, str]) -> Stack:
    """REV's compose files in REV's tree, with this run's .env and certificate; the tags they
    name given to REV's image and the stand-ins."""
    tags = {old_tag: "localhost/wecom-glm-bot:cpu",
            **{standins[name]: tag for name, tag in OLD_TAGS.items()}}
    for image, tag in tags.items():
        subprocess.run(["podman", "tag", image, tag], env=env, check=True)
    write_values(old, values)
    shutil.copytree(src / "docker" / "nginx" / "certs", old / "docker" / "nginx" / "certs",
                    dirs_exist_ok=True)
    return Stack(shutil.which("podman-compose") or "podman-compose", smoke.PROJECT, old,
                 smoke.COMPOSE_FILES, env)


def run(args, src: Path, env: dict[str, str], standins: dict[str, str], new_tag: str,
        total: float) -> int:
    rev = subprocess.run(["git", "rev-parse", "--short", args.upgrade_from], cwd=smoke.ROOT,
                         text=True, capture_output=True, check=True).stdout.strip()
    work = smoke.CACHE / "smoke"
    old_tag = f"localhost/wecom-glm-bot:{rev}"
    with smoke.step(f"build {old_tag} (REV's code, this tree's build)"):
        old = old_tree(rev, src, work)
        images.build_app(old, old_tag, env)
        print(f"    {old_tag}: {images.size_mb(old_tag, env):.0f} MB")
    with smoke.step("certificate and .env (the same secrets for both)"):
        cert = smoke.make_certificate(src)
        values = smoke.write_env(src, {**standins, "BOT_IMAGE": new_tag})
    before_stack = old_stack(old, src, values, old_tag, standins, env)
    stack = Stack(shutil.which("podman-compose") or "podman-compose", smoke.PROJECT, src,
                  smoke.COMPOSE_FILES, env)
    stack.down(volumes=True)
    ok = False
    try:
        print(f"--- the stack at {rev} (its compose files)")
        smoke.bring_up(before_stack, args.timeout)
        smoke.exercise(before_stack, src, cert, values, work, smoke.QUESTIONS[:2],
                       admin="smoke-admin-before")
        before = snapshot(before_stack)
        print(f"    at {rev}: {before}")

        print(f"--- the stack at this tree ({new_tag}, its compose files), same volumes")
        smoke.bring_up(stack, args.timeout)
        said = stack.logs_tail(stack.container("migrate"), 200).splitlines()
        upgraded = [line for line in said if line.startswith("database upgraded from")]
        print(f"    migrate (new image) said: {upgraded or [said[-1] if said else '']}")
        after_up = snapshot(stack)
        kept = all(int(after_up[t]) >= int(before[t]) for t in COUNTED) \
            and set(before["users"].split(",")) <= set(after_up["users"].split(","))
        print(f"    after the upgrade: {after_up}\n    rows kept: {'yes' if kept else 'NO'}")
        print("--- the new images: a question, an admin account, the chain across the upgrade")
        smoke.exercise(stack, src, cert, values, work, smoke.QUESTIONS[2:], load_kb=False,
                       admin="smoke-admin-after")
        after = snapshot(stack)
        print(f"    finally: {after}")
        ok = kept and int(after["audit_events"]) >= int(before["audit_events"])
    finally:
        if not args.keep:
            with smoke.step("down (containers and volumes)"):
                stack.down(volumes=True)
        smoke.report(total, ok)
    return 0 if ok else 1
