"""The images' requirements, from pyproject.toml and the lock file.

    python docker/requirements.py [pyproject.toml]
        the runtime dependencies, one a line, torch left out (what the images need besides torch)
    python docker/requirements.py --torch-variant cpu [pyproject.toml]
        the same with torch pinned to its CPU build (torch==2.13.0+cpu): the input of the lock
        file, docker/requirements.in (docker/lock.sh)
    python docker/requirements.py --lock-without-torch docker/requirements.lock
        the lock file without its torch entry: the CUDA image installs torch from PyTorch's
        CUDA index first (with the CUDA libraries it brings), then this

Only these two files are copied into the images' dependency step, so that layer is rebuilt only
when the dependencies change.
"""

from __future__ import annotations

import re
import sys
import tomllib

_TORCH = re.compile(r"torch\s*[=<>!~]")


def runtime_dependencies(pyproject: str) -> list[str]:
    with open(pyproject, "rb") as f:
        return tomllib.load(f)["project"]["dependencies"]


def without_torch(deps: list[str]) -> list[str]:
    return [d for d in deps if not _TORCH.match(d)]


def with_torch_variant(deps: list[str], variant: str) -> list[str]:
    """torch==X becomes torch==X+VARIANT (PyTorch's local version of a build, e.g. +cpu)."""
    return [f"{d.split(';')[0].strip()}+{variant}" if _TORCH.match(d) else d for d in deps]


def lock_without(lock_text: str, name: str) -> str:
    """A pip-compile lock file less one package's entry (its line and its --hash / comment
    continuation lines)."""
    out, skipping = [], False
    entry = re.compile(rf"{re.escape(name)}==", re.I)
    for line in lock_text.splitlines():
        if line and not line[0].isspace():
            skipping = bool(entry.match(line))
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> None:
    if argv[:1] == ["--lock-without-torch"]:
        with open(argv[1]) as f:
            sys.stdout.write(lock_without(f.read(), "torch"))
        return
    if argv[:1] == ["--torch-variant"]:
        deps = with_torch_variant(runtime_dependencies(argv[2] if len(argv) > 2 else "pyproject.toml"), argv[1])
    else:
        deps = without_torch(runtime_dependencies(argv[0] if argv else "pyproject.toml"))
    print("\n".join(deps))


if __name__ == "__main__":
    main(sys.argv[1:])
