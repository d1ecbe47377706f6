"""What the project installs: the core dependencies are what every sidecar needs (the nightly
jobs' and the demo's packages are extras), every requirement is pinned in requirements.lock
with a version it allows, and only the jobs and the demo import the extras' packages."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = {"pyspark", "pandas", "pyarrow", "osmium", "paho-mqtt"}
# where they may be imported: the jobs, the demo, the benchmarks, the tests
ALLOWED = ("spark_jobs/", "deploy/spark_", "deploy/demo/", "deploy/demo_cmd.py", "bench/", "tests/")
IMPORT_NAMES = {"pyspark": "pyspark", "pandas": "pandas", "pyarrow": "pyarrow", "osmium": "osmium",
                "paho": "paho-mqtt"}


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: {line!r} is not name==version"
            pins[canonicalize_name(name)] = version
    return pins


def test_the_core_is_what_every_sidecar_needs() -> None:
    project = _project()
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}  # type: ignore[attr-defined]
    assert not core & EXTRAS_ONLY, core & EXTRAS_ONLY
    extras = project["optional-dependencies"]
    assert {"spark", "demo", "dev"} <= set(extras)  # type: ignore[arg-type]


def test_every_requirement_is_pinned_in_the_lock() -> None:
    project = _project()
    pins = _lock()
    wanted = [*project["dependencies"], *(r for rs in project["optional-dependencies"].values()  # type: ignore[attr-defined]
                                          for r in rs)]
    for text in wanted:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"{req.name}=={pins[name]} is not {req.specifier}"


def test_only_the_jobs_and_the_demo_import_the_extras() -> None:
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith((".venv/", "build/", ".scratch/")) or rel.startswith(ALLOWED):
            continue
        tree = ast.parse(path.read_text(), rel)
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                if name.split(".")[0] in IMPORT_NAMES:
                    found.append(f"{rel}:{node.lineno} imports {name}")
    assert found == []
