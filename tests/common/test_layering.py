"""The pipeline's one-way data flow, enforced on the source: a stage imports only upstream stages.

traces → corpus → load → engine → cache → server → gates → analysis → reports, with ``common`` below
all of them. ``harness/cli.py`` and ``harness/demo.py`` sit above every stage. The check parses
each module's imports (static and ``importlib.import_module`` string literals are not followed;
stages use plain imports for each other).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "harness"

RANK = {
    "common": 0,
    "traces": 1,
    "corpus": 2,
    "load": 3,
    "engine": 4,
    "cache": 5,
    "server": 6,
    "gates": 7,
    "analysis": 8,
    "reports": 9,
}


def _harness_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("harness")]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.startswith("harness")
        ):
            found.append((node.lineno, node.module))
    return found


def _stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else None


def test_every_stage_directory_is_ranked() -> None:
    stages = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert stages == set(RANK), f"unranked or missing stages: {stages ^ set(RANK)}"


@pytest.mark.parametrize("stage", sorted(RANK, key=RANK.__getitem__))
def test_stage_imports_only_upstream(stage: str) -> None:
    bad = []
    for path in sorted((PKG / stage).rglob("*.py")):
        for lineno, module in _harness_imports(path):
            target = _stage_of(module)
            if target is None or target == stage:
                if module in ("harness.cli", "harness.demo"):
                    bad.append(f"{path.relative_to(PKG.parent)}:{lineno} imports {module}")
                continue
            if RANK[target] > RANK[stage]:
                bad.append(f"{path.relative_to(PKG.parent)}:{lineno} imports downstream {module}")
    assert not bad, "\n".join(bad)


def test_layering_check_catches_a_downstream_import(tmp_path: Path) -> None:
    """The scanner itself must see a violation when one is planted."""
    planted = tmp_path / "planted.py"
    planted.write_text("from harness.server.app import create_app\nimport harness.gates\n")
    modules = [m for _, m in _harness_imports(planted)]
    assert [_stage_of(m) for m in modules] == ["server", "gates"]
