"""The benchmarks read like the package: no import circle among their modules, each
contender set up in one module that every part imports (benchmarks/sides.py, and
benchmarks/dramatiq_side.py for Dramatiq's broker), every worker started by one
(benchmarks/workers.py).

``benchmarks/`` is a directory of scripts, each importing its siblings by their bare
names (it is ``sys.path[0]`` when one of them runs), not a package that import-linter
could be given, so the imports are read here from the source: every ``import`` and
``from ... import`` anywhere in a module (inside functions and ``TYPE_CHECKING`` blocks
too, as import-linter counts them) that names a sibling module.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text(), str(path))
            for path in sorted(BENCHMARKS.glob("*.py"))}


def _imports(tree: ast.Module, siblings: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found & siblings


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (the modules on it, the first repeated at the end),
    or ``None``."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return [*path[path.index(imported):], imported]
            if imported not in state:
                found = visit(imported)
                if found:
                    return found
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_no_benchmark_module_imports_one_that_imports_it_back() -> None:
    modules = _modules()
    graph = {name: _imports(tree, set(modules)) - {name} for name, tree in modules.items()}
    assert graph.get("run"), "benchmarks/run.py imports its parts"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_circle_through_three_modules() -> None:
    graph = {"run": {"latency"}, "latency": {"phases"}, "phases": {"run"}, "report": set()}
    assert _cycle(graph) == ["latency", "phases", "run", "latency"]
    assert _cycle({"run": {"report"}, "report": set()}) is None


def _calls(tree: ast.Module) -> set[str]:
    """The dotted names every call in ``tree`` calls (``amqp.Connection``, ``Celery``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts: list[str] = []
            func = node.func
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if isinstance(func, ast.Name):
                names.add(".".join([func.id, *reversed(parts)]))
    return names


def test_each_contender_is_built_in_its_one_module_and_nowhere_else() -> None:
    builders = {"Celery": "sides", "celery.Celery": "sides", "ojs_kombu.install": "sides",
                "amqp.Connection": "sides", "RabbitmqBroker": "dramatiq_side"}
    modules = _modules()
    built_elsewhere = sorted(
        f"{name}.py calls {call}" for name, tree in modules.items()
        for call in _calls(tree) if call in builders and builders[call] != name)
    assert built_elsewhere == []
    for call, owner in builders.items():
        if call not in ("celery.Celery", "amqp.Connection"):
            assert call in _calls(modules[owner]), f"{owner}.py no longer builds {call}"
    users = [name for name, tree in modules.items() if "sides" in _imports(tree, {"sides"})]
    assert len(users) >= 20, users


def test_every_worker_subprocess_starts_in_workers_py() -> None:
    """Worker processes start through ``workers.spawn``; the traced publish part's own
    publishing processes (fed over stdin) are the one other subprocess."""
    starters = sorted(name for name, tree in _modules().items()
                      if "subprocess.Popen" in _calls(tree))
    assert starters == ["traced_publish", "workers"]
