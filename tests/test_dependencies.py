"""The packages and their arrows (docs/architecture.md), from a real import graph.

Every module of ``app``, ``worker``, ``inference``, ``emulator`` and ``demo`` is parsed; every
import counts, inside functions too, and importing ``a.b.c`` runs ``a`` and ``a.b`` first. The
tiers may import only what the table below lets them:

- ``worker`` -> the core (``app`` but not ``app.web``); ``app.web`` -> the core; the core ->
  ``inference`` only through ``app.llm``; ``inference`` -> nothing of ours;
- the emulator -> only WeCom's protocol (``PROTOCOL``, which itself stays within it);
- nothing of the product imports ``demo`` (the demo model's training and evaluation);
- the core and the worker never import Flask, werkzeug or gunicorn, so the worker's process runs
  without them (checked again in a fresh interpreter);
- no import cycle anywhere: a cycle is what makes "import this first" matter, and the reason a
  module starts importing inside functions.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.import_graph import find_cycle

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "worker", "inference", "emulator", "demo")
WEB_ONLY = ("flask", "werkzeug", "gunicorn", "flask_wtf", "jinja2")
# the command line (``python -m app.cli``, also ``flask --app app.web.factory``) stays at its path
# for operators, and reaches the admin area's helpers: it sits with the web tier
WEB_ENTRY = {"app.cli"}
# WeCom's wire protocol: what the emulator may use to speak it
PROTOCOL = {"app.wecom.crypto", "app.wecom.xmlparse", "app.wecom.exceptions", "app.wecom.aibot",
            "app.wecom.aibot_ws", "app.json_input"}
PACKAGES_ON_THE_WAY = {"app", "app.wecom"}  # run before the protocol's modules: they import nothing


# the engine's package ``__init__``s are its registries (``inference.models.MODELS``, the engine's
# front), nano-vllm's way: inside ``inference`` only the imports written count (as in
# tests/inference/test_package.py); everywhere else importing ``a.b.c`` runs ``a`` and ``a.b``
EXPLICIT_ONLY = {"inference"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def tier(module: str) -> str:
    if module == "app.web" or module.startswith("app.web.") or module in WEB_ENTRY:
        return "web"
    if module == "app" or module.startswith("app."):
        return "core"
    return module.split(".")[0]


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports (``from a import b``: ``a.b`` when that is a module of ours),
    at any depth: function-level imports count too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            children = [f"{node.module}.{a.name}" for a in node.names]
            ours = [c for c in children if c in MODULES]
            found += [(node.lineno, c) for c in ours]
            if len(ours) < len(children):
                found.append((node.lineno, node.module))
    return found


def runs(target: str) -> list[str]:
    """The modules of ours that importing ``target`` executes: its packages, then itself."""
    parts = target.split(".")
    return [step for n in range(1, len(parts) + 1) if (step := ".".join(parts[:n])) in MODULES]


def graph() -> dict[str, dict[str, int]]:
    """Module -> {module of ours it runs: line}."""
    edges: dict[str, dict[str, int]] = {}
    for name, path in MODULES.items():
        edges[name] = {}
        for line, target in imports_of(path):
            steps = runs(target)
            if name.split(".")[0] in EXPLICIT_ONLY:
                steps = steps[-1:]
            for step in steps:
                if step != name and not name.startswith(step + "."):  # a package's own parents
                    edges[name].setdefault(step, line)
    return edges


def may_import(source: str, target: str) -> bool:
    src, dst = tier(source), tier(target)
    if src == dst:
        return True
    allowed = {
        "web": {"core"},
        "worker": {"core"},
        "core": {"inference"} if source == "app.llm" or source.startswith("app.llm.") else set(),
        "emulator": {"core"} if target in PROTOCOL | PACKAGES_ON_THE_WAY else set(),
        "demo": {"core", "web", "inference"},
        "inference": set(),
    }[src]
    return dst in allowed


def wrong_arrows(edges) -> list[str]:
    wrong = []
    for source, targets in sorted(edges.items()):
        for target, line in sorted(targets.items()):
            if not may_import(source, target):
                wrong.append(f"{MODULES[source].relative_to(ROOT)}:{line} ({tier(source)}) "
                             f"imports {target} ({tier(target)})")
    return wrong


def describe(cycle: list[str], edges) -> str:
    return "\n".join(f"{MODULES[a].relative_to(ROOT)}:{edges[a][b]} imports {b}"
                     for a, b in zip(cycle, cycle[1:], strict=False))


def test_every_arrow_points_the_allowed_way():
    assert not wrong_arrows(graph()), "\n".join(wrong_arrows(graph()))


def test_no_import_cycle_anywhere():
    edges = graph()
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle:\n" + describe(cycle, edges)


@pytest.mark.parametrize("tier_name", ["core", "worker"])
def test_only_the_web_tier_imports_flask_werkzeug_or_gunicorn(tier_name):
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {module}"
             for name, path in MODULES.items() if tier(name) == tier_name
             for line, module in imports_of(path) if module.split(".")[0] in WEB_ONLY]
    assert not wrong, "\n".join(wrong)


def test_the_emulators_protocol_stays_within_itself():
    edges = graph()
    for module in PROTOCOL | PACKAGES_ON_THE_WAY:
        outside = {t for t in edges[module] if t not in PROTOCOL | PACKAGES_ON_THE_WAY}
        assert not outside, f"{module} imports {sorted(outside)}"


@pytest.mark.parametrize("module", ["worker.processor", "worker.celery_app", "worker.tasks"])
def test_the_worker_process_loads_no_web_framework(module):
    code = (f"import json, sys; import {module}; "
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {list(WEB_ONLY)!r} "
            f"or m == 'app.web' or m.startswith('app.web.'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


# -- the checks see what they are meant to see ------------------------------------------------------


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from worker.tasks import build_processor\n")
    assert imports_of(bad) == [(2, "worker.tasks")]


def test_from_a_package_import_a_module_is_that_module(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from app.audit import chain\nfrom app.audit.chain import EventType\n")
    assert imports_of(source) == [(1, "app.audit.chain"), (2, "app.audit.chain")]
    assert runs("app.audit.chain") == ["app", "app.audit", "app.audit.chain"]


def test_a_wrong_arrow_is_reported():
    assert not may_import("worker.processor", "app.web.callback")
    assert not may_import("app.services", "app.web.factory")
    assert not may_import("app.knowledge.store", "inference.server.embeddings")
    assert may_import("app.llm.engine_backend", "inference.engine.service")
    assert not may_import("inference.llm", "app.knowledge")
    assert not may_import("emulator.callbacks", "app.services")
    assert may_import("emulator.callbacks", "app.wecom.crypto")
    assert not may_import("app.knowledge.evaluate", "demo.eval")
    assert may_import("app.web.callback", "app.audit.chain")
    assert wrong_arrows({"worker.tasks": {"app.web.health": 3}}) == [
        "worker/tasks.py:3 (worker) imports app.web.health (web)"]


def test_a_cycle_through_a_function_level_import_is_found():
    edges = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 9}, "d": {"a": 1}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}}) is None


def test_at_most_15_modules_at_the_top_of_the_core():
    """Families live in folders (audit/, aibot/, metrics/, ...): the top of ``app/`` stays a map."""
    top = sorted(p.name for p in (ROOT / "app").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 15, top


def test_the_core_package_builds_nothing():
    """``import app.x`` runs ``app/__init__.py`` first: it must stay a docstring, or every process
    pays for (and may cycle through) what it imports."""
    tree = ast.parse((ROOT / "app" / "__init__.py").read_text())
    assert all(isinstance(node, ast.Expr) for node in tree.body), "app/__init__.py holds code"
