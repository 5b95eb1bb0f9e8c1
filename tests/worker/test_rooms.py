"""The worker's rooms: at most 15 modules at the top of ``worker/`` (families in folders), no
import cycle among its modules (imports inside functions count, and so does a package's
``__init__`` on the way to its modules), and no module using another module's ``_private`` name
(the processor's parts get public collaborators, never its insides)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.import_graph import find_cycle

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "worker"
MAX_TOP_LEVEL = 15


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(WORKER.rglob("*.py"))}


def worker_imports(path: Path) -> dict[str, str]:
    """The worker modules ``path`` imports (at any depth), each with the local name it is bound
    to where it is bound to the module itself ("" otherwise)."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    found[alias.name] = alias.asname or ""
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES:
            found.setdefault(node.module, "")
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                if child in MODULES:  # ``from worker.media import handler``: the module itself
                    found[child] = alias.asname or alias.name
    return found


def graph() -> dict[str, set[str]]:
    """Module -> the worker modules importing it runs (a package's ``__init__`` included)."""
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for target in worker_imports(path):
            parts = target.split(".")
            for depth in range(2, len(parts) + 1):  # worker.media.handler runs worker.media first
                step = ".".join(parts[:depth])
                if step != name and step in MODULES:
                    edges[name].add(step)
    return edges


def test_at_most_15_modules_at_the_top_of_the_worker():
    top = sorted(p.name for p in WORKER.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL, top


def test_no_import_cycle_in_the_worker():
    assert find_cycle(graph()) is None, " -> ".join(find_cycle(graph()))


def test_the_cycle_check_sees_a_cycle_through_a_function_level_import():
    edges = graph()
    edges["worker.runtime"].add("worker.tasks")  # as metrics once read tasks._runtime
    assert find_cycle(edges) is not None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def own_private_names(tree: ast.Module) -> set[str]:
    """The ``_names`` a module defines itself: functions, classes, variables, attributes it sets."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {name for name in names if name.startswith("_")}


def private_uses(path: Path) -> list[str]:
    """``from worker.x import _name``, ``x._name`` of a worker module, ``getattr(o, "_name")``,
    and ``anything._name`` that this module does not define itself (another's insides, such as
    ``self.processor._generate``)."""
    tree = ast.parse(path.read_text(), str(path))
    modules = {local for local in worker_imports(path).values() if local}
    own = own_private_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in MODULES:
            found += [f"{path.name}:{node.lineno} imports {node.module}.{a.name}"
                      for a in node.names if a.name.startswith("_")]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in modules and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}")
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_")
              and not node.attr.startswith("__") and node.attr not in own):
            found.append(f"{path.name}:{node.lineno} uses {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and str(node.args[1].value).startswith("_")):
            found.append(f"{path.name}:{node.lineno} reads {node.args[1].value} by getattr")
    return found


def test_no_module_uses_another_ones_private_names():
    wrong = [use for path in MODULES.values() for use in private_uses(path)]
    assert not wrong, "\n".join(wrong)


def test_the_private_check_sees_what_metrics_and_media_once_did(tmp_path):
    old = tmp_path / "old.py"
    old.write_text("from worker import tasks\nfrom worker.tasks import _runtime\n"
                   "def f(processor):\n    tasks._runtime\n    getattr(processor, '_llm', None)\n"
                   "class MediaHandler:\n    def voice(self):\n        self._heard = 1\n"
                   "        return self._heard, self.processor._generate()\n")
    assert sorted(use.split(" ", 1)[1] for use in private_uses(old)) == sorted([
        "imports worker.tasks._runtime", "uses tasks._runtime", "reads _llm by getattr",
        "uses self.processor._generate"])
