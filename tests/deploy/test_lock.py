"""docker/requirements.lock: every package the images install, pinned with hashes, in step with
pyproject.toml (docker/lock.sh writes it; the Dockerfiles install it with --require-hashes)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from tests.deploy.conftest import ROOT

LOCK = ROOT / "docker" / "requirements.lock"
ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.M)


def helper(*args: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / "docker" / "requirements.py"), *args],
                          capture_output=True, text=True, check=True).stdout


def locked() -> dict[str, str]:
    return {name.lower(): version for name, version in ENTRY.findall(LOCK.read_text())}


def entries(text: str) -> list[list[str]]:
    """The lock's entries, each its own lines (the pin, its hashes, its 'via' comments)."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if ENTRY.match(line):
            blocks.append([line])
        elif blocks and line.startswith((" ", "\t")):
            blocks[-1].append(line)
    return blocks


def runtime_dependencies() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def test_every_runtime_dependency_is_locked_at_its_pin():
    pins = locked()
    for dep in runtime_dependencies():
        name, version = re.match(r"([A-Za-z0-9._-]+)(?:\[[^]]*\])?==(\S+)", dep).groups()
        want = f"{version}+cpu" if name == "torch" else version
        assert pins.get(name.lower()) == want, f"{dep}: the lock has {pins.get(name.lower())}; run docker/lock.sh"


def test_the_lock_was_made_from_todays_pyproject():
    assert (ROOT / "docker" / "requirements.in").read_text().split() == \
        helper("--torch-variant", "cpu", str(ROOT / "pyproject.toml")).split()


def test_every_entry_has_sha256_hashes():
    blocks = entries(LOCK.read_text())
    assert len(blocks) == len(locked()) > 40
    for block in blocks:
        hashes = [line for line in block if re.search(r"--hash=sha256:[0-9a-f]{64}", line)]
        assert hashes, f"{block[0]} has no hash"


def test_the_lock_installs_on_debian_12s_python():
    # redis asks for async-timeout below Python 3.11.3; Debian 12 (the local base) has 3.11.2
    assert "async-timeout" in locked()


def test_the_cuda_image_gets_the_lock_without_torch():
    rest = helper("--lock-without-torch", str(LOCK))
    assert "torch==" not in rest and "--hash" in rest
    full = {b[0].split("==")[0]: b for b in entries(LOCK.read_text())}
    kept = {b[0].split("==")[0]: b for b in entries(rest)}
    assert set(full) - set(kept) == {"torch"}
    assert all(kept[name] == block for name, block in full.items() if name != "torch")


def test_pycryptodome_is_for_the_tests_only():
    """Only the tests import it (a second AES implementation to check ours against)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("pycryptodome") for d in project["dependencies"])
    assert any(d.startswith("pycryptodome") for d in project["optional-dependencies"]["dev"])
    assert "pycryptodome" not in locked()
    importing = re.compile(r"^\s*(from|import)\s+Crypto(\.|\s|$)", re.M)
    for package in ("app", "worker", "inference", "emulator", "scripts"):
        for path in (ROOT / package).rglob("*.py"):
            assert not importing.search(path.read_text(encoding="utf-8")), path
