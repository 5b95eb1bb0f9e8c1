"""The packages depend one way: ``worker`` -> ``app`` -> ``inference``, never back. The web
process (``app``) builds the Celery app and publishes by task name, reads the heartbeats and
calls models through ``app.llm`` without importing the worker; ``inference`` imports none of
ours, with no exception: the demo model's corpus, training and evaluation (``demo``), which use
the knowledge base, sit outside it, and nothing of the product imports them.
The local WeCom emulator (``emulator``, outside the images) uses ``app``'s protocol; no production
package imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "app": ("worker", "emulator", "demo"),
    "worker": ("emulator", "demo"),
    "inference": ("app", "worker", "emulator", "demo"),
}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth (function-level imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_never_imports_the_ones_above_it(package):
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in imports_of(path):
            if module.split(".")[0] in FORBIDDEN[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_backward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from worker.tasks import build_processor\n")
    assert imports_of(bad) == [(2, "worker.tasks")]


def test_the_check_sees_an_import_of_the_emulator(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import emulator.media\nfrom emulator import EmulatorServer\n")
    assert [m.split(".")[0] for _, m in imports_of(bad)] == ["emulator", "emulator"]
