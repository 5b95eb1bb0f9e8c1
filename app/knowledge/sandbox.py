"""PDF, DOCX and HTML read in a child process under CPU-time and memory limits.

A document's size says little about what reading it costs: a 16 KB PDF whose 100 pages share one
content stream of drawing operators kept a worker busy for 58 s, and the parsers (pypdf,
python-docx, lxml) are large C-and-Python code fed by strangers (an employee's file message, an
admin's upload). So the parent hands the bytes to ``python -I`` running this file, which limits
itself before it reads them (``resource.setrlimit``: ``RLIMIT_CPU`` of ``CPU_S`` seconds past
its start-up, ``RLIMIT_AS`` of ``MEMORY_BYTES``, no core files, no file writes), parses with
``app.knowledge.parsing.extract_blocks``, and answers JSON (never pickle: a parser subverted by
its input must not get code run in the parent). The parent waits at most ``wall_s`` and refuses
the document with a reason the uploader can act on: too costly to read, too much memory, or
damaged. Nothing is written before the answer, so a refusal loses nothing.

The child gets no environment but ``PATH`` and a locale (no secret of the service reaches a
process that parses hostile files), ``-I`` ignores ``PYTHON*`` variables and the working
directory, and it loads ``parsing.py`` by path: the ``app`` package (Flask, SQLAlchemy, the
settings) is never imported there, which keeps a start at about a tenth of a second of CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

CPU_S = 20  # seconds of CPU for one document, past the child's start-up
MEMORY_BYTES = 1024 * 1024 * 1024  # the child's address space
HERE = Path(__file__).resolve()
PARSING = HERE.with_name("parsing.py")


class Unreadable(ValueError):
    """The document could not be read within the limits; the message says why, for the uploader
    (``parsing.parse`` hands it on as its ``UploadError``: this module imports nothing of
    ``parsing``, which imports it)."""


def extract(data: bytes, kind: str, cpu_s: int | None = None,
            memory_bytes: int | None = None) -> list[tuple[str, int]]:
    """The blocks of ``data`` (a ``kind`` of ``parsing.SANDBOXED``) as (text, level), read in a
    limited child process (``CPU_S``, ``MEMORY_BYTES`` unless given); ``Unreadable`` with the
    reason when it cannot be read within the limits."""
    cpu_s, memory_bytes = cpu_s or CPU_S, memory_bytes or MEMORY_BYTES

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    try:
        done = subprocess.run([sys.executable, "-I", str(HERE), kind, str(cpu_s), str(memory_bytes)],
                              input=data, capture_output=True, env=env, timeout=wall_s(cpu_s))
    except subprocess.TimeoutExpired:
        raise Unreadable(f"reading the {kind.upper()} took too long; save it again (e.g. print "
                          "to a new PDF) or split it, and upload that") from None
    if done.returncode == -signal.SIGXCPU or done.returncode == -signal.SIGKILL:
        raise Unreadable(f"the {kind.upper()} is too costly to read (more than {cpu_s} s of "
                          "processing): save it again as a simpler file (print to a new PDF, "
                          "or export a DOCX) or split it, and upload that")
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise Unreadable(f"the {kind.upper()} could not be read (the reader stopped: "
                          f"{_reason(done)}); save it again and upload")
    if "error" in answer:
        raise Unreadable(str(answer["error"]))
    try:
        return [(str(text), int(level)) for text, level in answer["blocks"]
                if isinstance(text, str) and 0 <= int(level) <= 6]
    except (KeyError, TypeError, ValueError):
        raise Unreadable(f"the {kind.upper()} could not be read; save it again and upload") from None


def wall_s(cpu_s: int) -> int:
    """How long the parent waits: the CPU limit bounds the work; this only ends a child that
    waits on nothing (on a busy machine a CPU second takes several on the clock)."""
    return max(60, 10 * cpu_s)


def _reason(done: subprocess.CompletedProcess) -> str:
    if done.returncode < 0:
        return f"signal {signal.Signals(-done.returncode).name}"
    last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    return last[0][:200]


# -- the child -----------------------------------------------------------------------------------
def limit_self(cpu_s: int, memory_bytes: int) -> None:
    """Limits on this process, before it reads a byte of the document."""
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    start_up = int(used.ru_utime + used.ru_stime) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (start_up + cpu_s, start_up + cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def child(kind: str, cpu_s: int, memory_bytes: int) -> int:
    import importlib.util

    spec = importlib.util.spec_from_file_location("wecom_bot_parsing", PARSING)
    parsing = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = parsing  # its dataclasses look themselves up there
    spec.loader.exec_module(parsing)
    if kind == "pdf":
        import pypdf  # noqa: F401 - imported before the limits: its start-up is not the document's
    elif kind == "docx":
        import docx  # noqa: F401
    limit_self(cpu_s, memory_bytes)
    data = sys.stdin.buffer.read()
    try:
        blocks = parsing.extract_blocks(data, kind)
        answer = {"blocks": [[b.text, b.level] for b in blocks]}
    except parsing.UploadError as exc:
        answer = {"error": str(exc)}
    except MemoryError:
        answer = {"error": f"the {kind.upper()} needs more than {memory_bytes // 2**20} MB to read: "
                           "save it again as a simpler file or split it"}
    sys.stdout.write(json.dumps(answer, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
