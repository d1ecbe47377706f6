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
    # pyarrow is the spark extra's: `archive months`, and `maintain` without an export, run without it
    ("deploy/archive_cmd.py", "spark_jobs"): "only an export needs pyarrow",
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


# --------------------------------------------------------------------------- sub-packages

# Circles between sub-packages still there, each with its reason; the list only shrinks (a
# circle gone must leave it, a new one fails). Empty since issue 35: deploy.rabbitmq sits below
# the rest of deploy/ (it takes the stack's settings and secrets as protocols, deploy/rabbitmq/
# nodes.py, and builds on deploy.processes, a leaf package), and its command-line side moved up
# (deploy/topology_cmd.py, deploy/inspect_topology_cmd.py).
KNOWN_CIRCLES: dict[frozenset[str], str] = {}
ROUTING_CORES = ("exchanges.x_geo", "ingress", "fence.x_fence")


def module_file(name: str) -> Path | None:
    p = ROOT.joinpath(*name.split("."))
    if (p / "__init__.py").exists():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").exists() else None


def imported_modules(path: Path) -> set[str]:
    """Every project module an import of `path` loads, `from package import module` included."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] in PRODUCT}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in PRODUCT:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}")}
    return out


def package_of(name: str) -> str:
    """A module's sub-package (a package is its own)."""
    p = module_file(name)
    return name if p is not None and p.name == "__init__.py" else name.rpartition(".")[0] or name


def sub_package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for folder in PRODUCT:
        for path in modules(folder):
            src = ".".join(path.relative_to(ROOT).parent.parts)
            for name in imported_modules(path):
                dst = package_of(name)
                if dst != src:
                    graph[src].add(dst)
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected groups of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.add(frozenset(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_circle_between_sub_packages() -> None:
    """One level below the folders too (issue 35): exchanges and exchanges.x_geo, fence and
    fence.x_fence ... import each other in no circle (shared types live in the vocabulary,
    exchanges/fence_binding.py, exchanges/fence_events.py, not in a role's core)."""
    found = circles(sub_package_graph())
    new = found - set(KNOWN_CIRCLES)
    assert new == set(), f"new circles between sub-packages: {new}"
    assert set(KNOWN_CIRCLES) - found == set(), "a known circle is gone: take it out of KNOWN_CIRCLES"


def test_the_sub_package_checker_sees_a_circle() -> None:
    assert circles({"a": {"a.b"}, "a.b": {"a"}, "c": {"a"}}) == {frozenset({"a", "a.b"})}
    assert circles({"a": {"b"}, "b": {"c"}}) == set()


def test_the_archiver_loads_no_routing_core() -> None:
    """The events archiver stores events; it has no business with x-geo's, x-ingress's or
    x-fence's routing (issue 35: it loaded 38 modules, x-geo's routing core among them)."""
    seen: set[str] = set()
    todo = ["fence.archive"]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages' __init__
        f = module_file(m)
        if f is not None:
            todo += sorted(imported_modules(f))
    loaded = {m for m in seen if module_file(m) is not None}
    cores = sorted(m for m in loaded if any(m == c or m.startswith(c + ".") for c in ROUTING_CORES))
    assert cores == [], f"the archiver loads {cores}"
    assert "exchanges.fence_events" in loaded  # what it does load: the events' vocabulary
