"""The floor plan (ARCHITECTURE.md) stays true: imports point down the layers, folders import
each other in no circle, and no module imports the project from inside a function to dodge a
cycle. Parses every module's imports (no import is executed)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Bottom to top; a folder imports only folders of lower layers (ingress and fence, the roles
# and the fence service, sit side by side and import neither each other).
LAYERS = {"hilbert_c": 0, "exchanges": 1, "ingress": 2, "fence": 2, "spark_jobs": 3, "deploy": 4,
          "bench": 5, "tests": 6}
PRODUCT = ("hilbert_c", "exchanges", "ingress", "fence", "spark_jobs", "deploy")
# Imports kept inside a function on purpose, with the reason (never a cycle).
LAZY = {
    ("deploy/sidecar_cmd.py", "fence.api_server"): "only the api process loads FastAPI",
    # `geofence status` and `down` need none of asyncpg, numpy and shapely; only `up` does
    ("deploy/sidecars.py", "deploy.migrate"): "only `up` prepares the database",
    ("deploy/sidecars.py", "exchanges"): "only `up` prepares the database",
    ("deploy/sidecars.py", "exchanges.worldmap"): "only `up` prepares the database",
    ("deploy/sidecars.py", "fence"): "only `up` prepares the database",
}


def modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts)


def project_imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for each import of a project folder."""
    out: list[tuple[str, int, bool]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [child.module]
            out.extend((n, child.lineno, in_function) for n in names if n.split(".")[0] in LAYERS)
            walk(child, inner)

    walk(ast.parse(path.read_text(), str(path)), False)
    return out


def edges() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for folder in LAYERS:
        for path in modules(folder):
            for name, line, _ in project_imports(path):
                target = name.split(".")[0]
                if target != folder:
                    found[(folder, target)].append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


def test_every_import_points_down_the_layers() -> None:
    upward = [f"{a} -> {b}: {', '.join(where[:3])}" for (a, b), where in sorted(edges().items())
              if LAYERS[b] >= LAYERS[a]]
    assert upward == [], "imports that do not point down the layers:\n" + "\n".join(upward)


def test_no_circle_between_folders() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges():
        graph[a].add(b)
    state: dict[str, int] = {}

    def circle_from(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (found := circle_from(nxt, [*path, node])):
                return found
        state[node] = 2
        return None

    for folder in sorted(graph):
        if folder not in state:
            assert (found := circle_from(folder, [])) is None, " -> ".join(found or [])


def test_no_function_level_import_of_the_project() -> None:
    found = []
    for folder in PRODUCT:
        for path in modules(folder):
            rel = str(path.relative_to(ROOT))
            found += [f"{rel}:{line} imports {name}" for name, line, inside in project_imports(path)
                      if inside and (rel, name) not in LAZY]
    assert found == [], ("imports inside functions (move them up, or list the reason in LAZY):\n"
                         + "\n".join(found))


@pytest.mark.parametrize("key", sorted(LAZY))
def test_the_lazy_imports_listed_exist(key: tuple[str, str]) -> None:
    """A LAZY entry whose import went away is removed, not left to excuse a new one."""
    path, name = key
    assert any(n == name and inside for n, _, inside in project_imports(ROOT / path)), key


def test_the_checker_sees_an_upward_and_a_function_level_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import os\nfrom exchanges import batch\n\ndef f():\n    from deploy import cli\n")
    assert project_imports(source) == [("exchanges", 2, False), ("deploy", 5, True)]
