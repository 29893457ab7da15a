"""The server package has no import cycles: no module imports (even lazily, inside a function) a
module that imports it back, directly or through others."""

from __future__ import annotations

import ast
from pathlib import Path

import harness.server

PACKAGE = "harness.server"


def _server_imports(path: Path) -> set[str]:
    """Every ``harness.server.*`` module that ``path`` imports, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE + "."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE + "."))
    return found


def test_no_module_of_the_server_imports_its_importer() -> None:
    root = Path(harness.server.__file__).parent
    graph = {f"{PACKAGE}.{p.stem}": _server_imports(p) for p in root.glob("*.py") if p.stem != "__init__"}
    assert {"harness.server.app", "harness.server.state", "harness.server.preload"} <= graph.keys()

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*path, nxt]
                if nxt not in path:
                    stack.append((nxt, [*path, nxt]))
        return None

    cycles = [c for m in graph if (c := cycle_from(m)) is not None]
    assert not cycles, " → ".join(cycles[0])
