"""The package's structure, enforced on the source: one-way data flow between stages, no import cycles.

traces → corpus → load → engine → cache → server → gates → experiments → analysis → reports, with
``common`` below all of them. ``harness/cli.py`` and ``harness/demo.py`` sit above every stage. The
check parses each module's imports with :mod:`ast`: at module level, inside functions (lazy imports) and under
``if TYPE_CHECKING:``; ``importlib.import_module("harness…")`` with a literal name counts too.

Within a stage, modules must not import each other in a circle either, lazily or not: a function-level
import that "breaks" a cycle only hides it (the two modules still cannot be understood, tested or
moved apart). TYPE_CHECKING-only imports are counted as well: a cycle that exists only for the types
still says two modules share a concept that belongs in one place (one of them, or a third module).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "harness"

RANK = {
    "common": 0,
    "traces": 1,
    "corpus": 2,
    "load": 3,
    "target.engine": 4,
    "target.cache": 5,
    "target.server": 6,
    "gates": 7,
    "experiments": 8,
    "analysis": 9,
    "reports": 10,
}

KNOWN_CYCLES: dict[frozenset[str], str] = {}
"""Cycles tolerated for now, each with why: none today (issue #20 removed the last two). None may be
added without a reason, and an entry must be deleted as soon as its cycle is gone (the test says so)."""


@dataclass(frozen=True)
class Import:
    lineno: int
    module: str
    """The module imported: ``from harness.a import b`` is ``harness.a.b`` when ``b`` is a module."""
    type_only: bool
    """Under ``if TYPE_CHECKING:``."""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_names(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package rooted at ``root``."""
    names: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def harness_imports(
    path: Path, modules: frozenset[str] = frozenset(), package: str = "harness"
) -> list[Import]:
    """Every import of ``package`` (or below) in ``path``, at any depth of its code."""
    found: list[Import] = []

    def add(lineno: int, name: str, type_only: bool) -> None:
        if name == package or name.startswith(package + "."):
            found.append(Import(lineno, name, type_only))

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node.lineno, alias.name, type_only)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                add(node.lineno, sub if sub in modules else node.module, type_only)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node.lineno, node.args[0].value, type_only)
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False)
    return found


def import_graph(root: Path) -> dict[str, dict[str, list[Import]]]:
    """Module → the package's modules it imports (with where and how).

    A package's ``__init__`` is a module like any other. Importing ``a.b`` also runs ``a/__init__``,
    but that implicit edge is not drawn: a package that re-exports its submodules would otherwise
    be "in a cycle" with each of them, which is how Python packages work, not a design problem. An
    explicit ``from a import X`` inside ``a.b`` (going through the ``__init__``) is drawn.
    """
    names = _module_names(root)
    known = frozenset(names)
    graph: dict[str, dict[str, list[Import]]] = {}
    for name, path in names.items():
        edges: dict[str, list[Import]] = {}
        for imp in harness_imports(path, known, package=root.name):
            target = imp.module
            while target not in known and "." in target:  # ``from a.b import func`` → a.b
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                edges.setdefault(target, []).append(imp)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, list[Import]]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan): each one holds a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _describe(cycle: frozenset[str], graph: dict[str, dict[str, list[Import]]]) -> str:
    lines = [" ↔ ".join(sorted(cycle))]
    for a in sorted(cycle):
        for b, imps in sorted(graph[a].items()):
            if b in cycle:
                where = ", ".join(f"line {i.lineno}{' (TYPE_CHECKING)' if i.type_only else ''}" for i in imps)
                lines.append(f"    {a} imports {b}: {where}")
    return "\n".join(lines)


TARGET = "target"
"""The system under test (engine, cache, server): one folder apart from the tool's stages, its parts
ranked as stages of their own (``target.engine`` …)."""


def _stage_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == TARGET:
        name = f"{TARGET}.{parts[2]}"
        return name if name in RANK else None
    return parts[1] if len(parts) > 1 and parts[1] in RANK else None


def _stage_dirs() -> dict[str, Path]:
    """Stage name → its folder (the target's parts under ``harness/target/``)."""
    out: dict[str, Path] = {}
    for p in PKG.iterdir():
        if not (p.is_dir() and (p / "__init__.py").exists()):
            continue
        if p.name == TARGET:
            out |= {
                f"{TARGET}.{q.name}": q for q in p.iterdir() if q.is_dir() and (q / "__init__.py").exists()
            }
        else:
            out[p.name] = p
    return out


def test_every_stage_directory_is_ranked() -> None:
    stages = set(_stage_dirs())
    assert stages == set(RANK), f"unranked or missing stages: {stages ^ set(RANK)}"


def test_the_target_stands_apart_from_the_tool() -> None:
    """The system under test lives under ``harness/target/``, one folder beside the tool's stages; its
    parts keep their rank (stages after them may use what they define: the cache's tier file, the
    engine's eviction rule in the simulator)."""
    assert {"target.engine", "target.cache", "target.server"} <= set(_stage_dirs())
    assert not any((PKG / name).exists() for name in ("engine", "cache", "server"))


@pytest.mark.parametrize("stage", sorted(RANK, key=RANK.__getitem__))
def test_stage_imports_only_upstream(stage: str) -> None:
    bad = []
    for path in sorted(_stage_dirs()[stage].rglob("*.py")):
        for imp in harness_imports(path):
            target = _stage_of(imp.module)
            if target is None or target == stage:
                if imp.module in ("harness.cli", "harness.demo"):
                    bad.append(f"{path.relative_to(PKG.parent)}:{imp.lineno} imports {imp.module}")
                continue
            if RANK[target] > RANK[stage]:
                bad.append(f"{path.relative_to(PKG.parent)}:{imp.lineno} imports downstream {imp.module}")
    assert not bad, "\n".join(bad)


def test_layering_check_catches_a_downstream_import(tmp_path: Path) -> None:
    """The scanner itself must see a violation when one is planted."""
    planted = tmp_path / "planted.py"
    planted.write_text("from harness.target.server.app import create_app\nimport harness.gates\n")
    modules = [imp.module for imp in harness_imports(planted)]
    assert [_stage_of(m) for m in modules] == ["target.server", "gates"]


def test_no_import_cycle_in_the_package() -> None:
    graph = import_graph(PKG)
    assert {
        "harness.target.server.app",
        "harness.load.plugin",
        "harness.target.cache.settings",
    } <= graph.keys()
    cycles = import_cycles(graph)
    new = [_describe(c, graph) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, "import cycles (lazy and TYPE_CHECKING imports count):\n" + "\n".join(new)
    gone = [" ↔ ".join(sorted(c)) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"no longer cycles, delete them from KNOWN_CYCLES: {gone}"


def test_cycle_check_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """A cycle closed by a function-level import, and one closed only for the types, are both found."""
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from planted.b import B\n")
    (pkg / "b.py").write_text("class B:\n    def f(self):\n        from planted import a\n")
    (pkg / "c.py").write_text("import planted.b\n")
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted.e import E\n"
    )
    (pkg / "e.py").write_text("import importlib\nD = importlib.import_module('planted.d')\n")
    graph = import_graph(pkg)
    assert graph["planted.b"]["planted.a"] == [Import(3, "planted.a", False)]
    assert graph["planted.d"]["planted.e"] == [Import(3, "planted.e", True)]
    assert sorted(map(sorted, import_cycles(graph))) == [
        ["planted.a", "planted.b"],
        ["planted.d", "planted.e"],
    ]


LOCUST_FREE = (
    "harness.load.summary",
    "harness.load.results",
    "harness.load.run_summary",
    "harness.load.options",
    "harness.load.inputs",
    "harness.load.control",
    "harness.load.messages",
    "harness.experiments.paired",
    "harness.reports.render",
)
"""Modules a process outside Locust imports (the CLI, the gates, the tests): importing locust there
would monkey-patch that process with gevent halfway through, after its threads exist, and module
locks taken before the patch then wait on a gevent hub in another thread (the suite hung on exactly
this: ``harness.load.summary`` → ``control`` → ``locust.runners``)."""


def test_the_load_stage_outside_locust_does_not_import_locust() -> None:
    import subprocess
    import sys

    code = (
        "import importlib, sys\n"
        f"for name in {LOCUST_FREE!r}:\n"
        "    importlib.import_module(name)\n"
        "    bad = sorted(m for m in sys.modules if m == 'locust' or m.startswith('locust.'))\n"
        "    assert not bad, (name, bad[:3])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
