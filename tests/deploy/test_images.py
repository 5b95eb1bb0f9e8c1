"""What the production images carry: the code they run (app/, worker/, inference/, the migrations,
the demo model), never the local WeCom emulator (emulator/, for the demo and the tests)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

from tests.deploy.conftest import ROOT

DOCKERFILES = ("Dockerfile.cpu", "Dockerfile.cuda")
PRODUCTION = {"alembic.ini", "gunicorn.conf.py", "app", "worker", "inference", "migrations", "models"}


def final_stage_copies(dockerfile: Path) -> list[str]:
    """The build-context sources the last stage COPYs (``COPY --from=`` takes from a stage)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    stages = re.split(r"^FROM\s", text, flags=re.M)
    sources = []
    for line in stages[-1].splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(w.startswith("--from") for w in words):
            continue
        sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]


def ignored(relpath: str, patterns: list[str]) -> bool:
    """Docker's rule, enough for these patterns: the last matching line wins, a ``!`` line
    re-includes, and a pattern that matches a folder leaves out everything under it."""
    parts = relpath.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        alternatives = {pat, pat.removeprefix("**/")}
        if any(fnmatch.fnmatchcase(c, p) for c in candidates for p in alternatives):
            result = not negate
    return result


def image_files(dockerfile: Path) -> list[str]:
    patterns = dockerignore()
    files = []
    for source in final_stage_copies(dockerfile):
        path = ROOT / source
        found = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files += [rel for p in found if not ignored(rel := p.relative_to(ROOT).as_posix(), patterns)]
    return files


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_copy_only_production_code(name):
    sources = final_stage_copies(ROOT / "docker" / name)
    assert {"app", "worker", "inference", "migrations"} <= set(sources)
    assert set(sources) <= PRODUCTION, f"{name} copies {sorted(set(sources) - PRODUCTION)}"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_production_images_do_not_carry_the_emulator(name):
    files = image_files(ROOT / "docker" / name)
    assert "app/__init__.py" in files and "worker/tasks.py" in files
    assert (ROOT / "emulator" / "__main__.py").is_file()  # the emulator exists, just not in here
    carried = [f for f in files if "emulator" in f.split("/") or f.split("/")[-1].startswith("emulator")]
    assert not carried, carried


def test_the_build_context_leaves_the_emulator_out():
    """Even a ``COPY . .`` would not bring it: .dockerignore leaves out emulator/ whole."""
    patterns = dockerignore()
    emulator_files = [p.relative_to(ROOT).as_posix() for p in (ROOT / "emulator").rglob("*") if p.is_file()]
    assert "emulator/templates/chat.html" in emulator_files
    assert all(ignored(f, patterns) for f in emulator_files)
    assert not ignored("app/wecom/crypto.py", patterns) and not ignored("models/demo/config.json", patterns)


def test_the_dockerignore_check_reads_like_docker():
    patterns = ["models/*", "!models/demo", "**/__pycache__", "tests/"]
    assert ignored("models/big/weights.bin", patterns)
    assert not ignored("models/demo/weights.bin", patterns)
    assert ignored("app/__pycache__/x.pyc", patterns)
    assert ignored("tests/app/x.py", patterns) and not ignored("app/tests.py", patterns)
