"""One settings registry (exchanges/settings_registry.py, issue 35): every environment variable
the project reads is declared there once, nothing else reads the environment by key, each
process's key list is a view of it (and accepts what it accepted before), its defaults are the
code's, and docs/settings.md is generated from it (`geofence settings --markdown`). Parses the
source (no import of it is needed to find the reads)."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploy import archive_cmd, cli, settings_cmd, sidecars
from deploy import settings as ls
from exchanges import settings_registry as reg
from exchanges import shell
from exchanges import topology as t
from fence import api_server
from spark_jobs import session

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("hilbert_c", "exchanges", "ingress", "fence", "spark_jobs", "deploy", "bench")
REGISTRY = "exchanges/settings_registry.py"
# The kernel's build runs from setup.py before the package exists: it reads its one key itself.
BUILD_SCRIPT, BUILD_KEY = "hilbert_c/build_kernel.py", "GEOFENCE_KERNEL_CFLAGS"
ENV_NAMES = ("env", "environ")  # the environment handed around as a mapping (read where it lands)
KEY = re.compile(r"^GEOFENCE_[A-Z0-9_]*[A-Z0-9]$")
DOC_KEY = re.compile(r"\bGEOFENCE_[A-Z0-9_]*[A-Z0-9]\b")
# Keys read from a copy of the environment made for a child process, which are not settings
CHILD_ENV = {("bench/cli.py", "PYTHONPATH"): "extended for the benchmark's own child process"}
# GEOFENCE_* words in the docs that are not settings
NOT_SETTINGS = {"GEOFENCE_PASSWORD": "the shell variable of the script `geofence topology show` prints"}


@dataclass(frozen=True)
class Access:
    where: str  # path:line
    key: str | None  # None: not a constant
    how: str  # "os" (os.environ / os.getenv), "mapping" (env / environ), "registry", "literal"
    read: bool


def _is_os_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os")


def accesses(path: Path, rel: str) -> list[Access]:
    """Every access of the environment by key in `path`, and every GEOFENCE_* string constant."""
    tree = ast.parse(path.read_text(), str(path))
    consts = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name)
              and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}

    def key(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return consts.get(node.id) if isinstance(node, ast.Name) else None

    out: list[Access] = []
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        first = None
        if isinstance(node, ast.Call):
            first = node.args[0] if node.args else None
            f = node.func
            on_environ = isinstance(f, ast.Attribute) and _is_os_environ(f.value) \
                and f.attr in ("get", "setdefault", "pop")
            getenv = isinstance(f, ast.Attribute) and f.attr == "getenv" and isinstance(f.value, ast.Name) \
                and f.value.id == "os"
            if on_environ or getenv:
                out.append(Access(where, key(first), "os", True))
            elif isinstance(f, ast.Attribute) and f.attr == "get" and isinstance(f.value, ast.Name) \
                    and f.value.id in ENV_NAMES:
                out.append(Access(where, key(first), "mapping", True))
            elif isinstance(f, ast.Attribute) and f.attr in ("read", "setdefault") \
                    and isinstance(f.value, ast.Name) and f.value.id in ("settings_registry", "reg"):
                out.append(Access(where, key(first), "registry", True))
        elif isinstance(node, ast.Subscript):
            reading = isinstance(node.ctx, ast.Load)
            if _is_os_environ(node.value):
                out.append(Access(where, key(node.slice), "os", reading))
            elif isinstance(node.value, ast.Name) and node.value.id in ENV_NAMES and reading:
                out.append(Access(where, key(node.slice), "mapping", True))
        elif isinstance(node, ast.Compare) and any(_is_os_environ(c) for c in node.comparators):
            out.append(Access(where, key(node.left), "os", True))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and KEY.match(node.value):
            out.append(Access(where, node.value, "literal", False))
    return out


def project_accesses() -> dict[str, list[Access]]:
    found = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            found[rel] = accesses(path, rel)
    return found


# --------------------------------------------------------------------------- the source


def test_nothing_reads_the_environment_by_key_but_the_registry() -> None:
    """os.environ[...], os.environ.get / setdefault / pop, os.getenv, `in os.environ`: only in
    the registry (its `read` and `setdefault`), and the kernel's build script for its key. The
    environment handed around whole (os.environ, dict(os.environ)) is fine."""
    found = [f"{a.where} reads {a.key or '(a computed key)'}" for rel, acc in project_accesses().items()
             for a in acc if a.how == "os" and a.read and rel != REGISTRY
             and (rel, a.key) != (BUILD_SCRIPT, BUILD_KEY)]
    assert found == [], ("environment reads outside exchanges/settings_registry.py (take the "
                         "environment in `main`, or use settings_registry.read):\n" + "\n".join(found))


def test_the_build_script_reads_its_one_key() -> None:
    reads = {a.key for a in accesses(ROOT / BUILD_SCRIPT, BUILD_SCRIPT) if a.how == "os" and a.read}
    assert reads == {BUILD_KEY}
    assert "read by hilbert_c/build_kernel.py at build time" in reg.declared(BUILD_KEY).description.lower()


def test_every_key_the_source_names_is_declared() -> None:
    """Every key read (from os.environ, a mapping of it, the registry) and every GEOFENCE_* string."""
    found = sorted({f"{a.where}: {a.key}" for rel, acc in project_accesses().items() for a in acc
                    if a.key is not None and a.key not in reg.BY_NAME and (rel, a.key) not in CHILD_ENV})
    assert found == [], ("keys not declared in exchanges/settings_registry.py (declare them there, "
                         "with type, default, roles and description):\n" + "\n".join(found))


def test_the_checker_sees_every_kind_of_read(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import os\nKEY = 'B'\n"
                      "a = os.environ['A']\nb = os.environ.get(KEY)\nc = os.getenv('C')\n"
                      "d = 'D' in os.environ\n"
                      "os.environ.setdefault('E', '1')\nf = env.get('F')\ng = environ['G']\n"
                      "h = settings_registry.read('H')\nos.environ['I'] = '1'\nj = dict(os.environ)\n"
                      "k = 'GEOFENCE_K'\nl = os.environ.get(name)\nenv['M'] = '1'\n")
    got = [(a.key, a.how, a.read) for a in accesses(source, "m.py")]
    assert sorted(got, key=str) == sorted([
        ("A", "os", True), ("B", "os", True), ("C", "os", True), ("D", "os", True), ("E", "os", True),
        ("F", "mapping", True), ("G", "mapping", True), ("H", "registry", True), ("I", "os", False),
        ("GEOFENCE_K", "literal", False), (None, "os", True)], key=str)


# --------------------------------------------------------------------------- the registry


def test_the_registry_is_well_formed() -> None:
    names = [s.name for s in reg.SETTINGS]
    assert len(names) == len(set(names))
    for s in reg.SETTINGS:
        assert s.roles and set(s.roles) <= set(reg.ROLES), s.name
        assert len(s.roles) == len(set(s.roles)), s.name
        assert s.type and s.description.endswith("."), s.name
    assert {r for s in reg.SETTINGS for r in s.roles} == set(reg.ROLES)  # no role without a key
    assert {s.name for s in reg.SETTINGS if s.secret} == {"GEOFENCE_AMQP_URL", "GEOFENCE_POSTGRES_URL"}


def test_read_refuses_an_undeclared_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KeyError, match="GEOFENCE_NOPE is not a declared setting"):
        reg.read("GEOFENCE_NOPE")
    with pytest.raises(KeyError):
        reg.setdefault("NOPE", "x")
    with pytest.raises(ValueError, match="unknown role"):
        reg.keys_for("x-nope")
    monkeypatch.setenv("GEOFENCE_LOG_LEVEL", "debug")
    assert reg.read("GEOFENCE_LOG_LEVEL") == "debug"
    assert reg.read("GEOFENCE_LOG_LEVEL", {}) is None
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    assert reg.setdefault("PYSPARK_PYTHON", "/other") == "/usr/bin/python3"
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert reg.setdefault("PYSPARK_PYTHON", "/other") == "/other"


# What each process accepted before the registry (issue 35): a change here changes which keys a
# process refuses, so it is deliberate.
SIDECAR = {"GEOFENCE_AMQP_URL", "GEOFENCE_POSTGRES_URL", "GEOFENCE_REGIONS", "GEOFENCE_WORKERS",
           "GEOFENCE_DRAIN_S", "GEOFENCE_BATCH_MAX", "GEOFENCE_PREFETCH", "GEOFENCE_LOG_LEVEL",
           "GEOFENCE_JOURNAL_DIR", "GEOFENCE_PERSISTENCE", "GEOFENCE_MEMCACHED_URL",
           "GEOFENCE_METRICS_LISTEN", "GEOFENCE_STALL_S", "GEOFENCE_MAX_FUTURE_S", "GEOFENCE_FENCE_BACKUPS",
           "GEOFENCE_TAKEOVER_S", "GEOFENCE_AMQP_NODES"}
API = {"GEOFENCE_API_HOST", "GEOFENCE_API_PORT", "GEOFENCE_FIREBASE_PROJECT", "GEOFENCE_PROMETHEUS_URL",
       "GEOFENCE_FIREBASE_WEB_API_KEY", "GEOFENCE_MAP_ROADS", "GEOFENCE_MAP_TILES", "GEOFENCE_API_RATE",
       "GEOFENCE_API_TOKEN_RATE", "GEOFENCE_API_FAILED_SIGN_INS", "GEOFENCE_API_TLS_LISTEN",
       "GEOFENCE_API_TLS_CERT", "GEOFENCE_API_TLS_KEY"}
SPARK = {"GEOFENCE_POSTGRES_URL", "GEOFENCE_AMQP_URL", "GEOFENCE_REGIONS", "GEOFENCE_WORKERS",
         "GEOFENCE_SPARK_MASTER", "GEOFENCE_JDBC_JAR", "GEOFENCE_SPARK_PARTITIONS",
         "GEOFENCE_ARCHIVE_RETENTION_DAYS", "GEOFENCE_ARCHIVE_EXPORT_DIR"}
STACK = {"GEOFENCE_STATE_DIR", "GEOFENCE_HOST", "GEOFENCE_AMQP_PORT", "GEOFENCE_MQTT_PORT",
         "GEOFENCE_MANAGEMENT_PORT", "GEOFENCE_PG_PORT", "GEOFENCE_MEMCACHED_PORT", "GEOFENCE_API_PORT",
         "GEOFENCE_FIREBASE_AUTH_PORT", "GEOFENCE_PROMETHEUS_PORT", "GEOFENCE_RABBITMQ_METRICS_PORT",
         "GEOFENCE_METRICS_PORT", "GEOFENCE_PG_BINDIR", "GEOFENCE_START_TIMEOUT", "GEOFENCE_REGIONS",
         "GEOFENCE_WORKERS", "GEOFENCE_MAP_TILES", "GEOFENCE_BROKERS", "GEOFENCE_GUARD_PORT",
         "GEOFENCE_GUARD_FAILED_LOGINS", "GEOFENCE_PUBLIC_HOST", "GEOFENCE_AMQPS_PORT", "GEOFENCE_MQTTS_PORT",
         "GEOFENCE_API_TLS_PORT", "GEOFENCE_TLS_DIR", "GEOFENCE_BROKER_NODES"}


def test_each_process_list_is_a_view_of_the_registry() -> None:
    lists: dict[str, tuple[str, ...]] = {
        "exchanges.topology.SIDECAR_ENV_KEYS": t.SIDECAR_ENV_KEYS, "exchanges.shell.ENV_KEYS": shell.ENV_KEYS,
        "fence.api_server.API_KEYS": api_server.API_KEYS, "spark_jobs.session.ENV_KEYS": session.ENV_KEYS,
        "deploy.settings.ENV_KEYS": ls.ENV_KEYS, "deploy.sidecars.PASSED_ON": sidecars.PASSED_ON}
    for name, keys in lists.items():
        assert set(keys) <= set(reg.BY_NAME), f"{name}: {set(keys) - set(reg.BY_NAME)} not declared"
    assert t.SIDECAR_ENV_KEYS == shell.ENV_KEYS == reg.SIDECAR_KEYS == reg.keys_for(*reg.SIDECAR_ROLES)
    assert reg.keys_for("api") == api_server.API_KEYS
    assert reg.keys_for("spark") == session.ENV_KEYS
    assert reg.keys_for("stack") == ls.ENV_KEYS
    assert set(sidecars.PASSED_ON) <= set(reg.SIDECAR_KEYS)
    assert all("cli" in reg.declared(k).roles for k in sidecars.PASSED_ON)  # `up` reads them


def test_each_process_accepts_what_it_accepted_before() -> None:
    assert set(reg.SIDECAR_KEYS) == SIDECAR
    assert set(api_server.API_KEYS) | SIDECAR == API | SIDECAR  # ApiConfig: the sidecar's and its own
    assert set(session.ENV_KEYS) == SPARK
    assert set(ls.ENV_KEYS) == STACK


def test_the_stack_parses_every_key_it_declares() -> None:
    assert set(ls._ENV_KEYS) == set(reg.keys_for("stack"))


def test_only_the_jobs_keys_are_in_their_namespace() -> None:
    """deploy/spark_cmd.py keeps GEOFENCE_SPARK_* keys from the stack's settings."""
    spaced = {s.name for s in reg.SETTINGS if s.name.startswith(session.SPARK_PREFIX)}
    assert spaced and spaced <= set(session.ENV_KEYS)


def test_a_sidecar_still_refuses_the_api_s_keys() -> None:
    env = {"GEOFENCE_AMQP_URL": "amqp://u:p@h/", "GEOFENCE_POSTGRES_URL": "postgresql://u:p@h/d",
           "GEOFENCE_API_PORT": "8081"}
    with pytest.raises(shell.ConfigError, match="unknown setting GEOFENCE_API_PORT"):
        shell.SidecarConfig.from_env("x-geo", "a", env)
    assert api_server.ApiConfig.from_env(env).port == 8081


# --------------------------------------------------------------------------- defaults


def _defaults(cls: Any) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def _as_text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# key -> the (dataclass, field) whose default it documents
CODE_DEFAULTS: dict[str, list[tuple[Any, str]]] = {
    **{f"GEOFENCE_{n.upper()}": [(shell.SidecarConfig, n)]
       for n in ("drain_s", "batch_max", "prefetch", "log_level", "journal_dir", "persistence",
                 "memcached_url", "metrics_listen", "stall_s", "max_future_s", "fence_backups",
                 "takeover_s")},
    "GEOFENCE_REGIONS": [(shell.SidecarConfig, "regions"), (ls.Settings, "regions"), (t.Topology, "regions")],
    "GEOFENCE_WORKERS": [(shell.SidecarConfig, "workers"), (ls.Settings, "workers"), (t.Topology, "workers")],
    "GEOFENCE_API_HOST": [(api_server.ApiConfig, "host")],
    "GEOFENCE_API_PORT": [(api_server.ApiConfig, "port"), (ls.Settings, "api_port")],
    "GEOFENCE_API_RATE": [(api_server.ApiConfig, "rate")],
    "GEOFENCE_API_TOKEN_RATE": [(api_server.ApiConfig, "token_rate")],
    "GEOFENCE_API_FAILED_SIGN_INS": [(api_server.ApiConfig, "failed_sign_ins")],
    "GEOFENCE_FIREBASE_PROJECT": [(api_server.ApiConfig, "firebase_project")],
    "GEOFENCE_PROMETHEUS_URL": [(api_server.ApiConfig, "prometheus_url")],
    "GEOFENCE_FIREBASE_WEB_API_KEY": [(api_server.ApiConfig, "web_api_key")],
    "GEOFENCE_MAP_ROADS": [(api_server.ApiConfig, "map_roads")],
    "GEOFENCE_MAP_TILES": [(api_server.ApiConfig, "map_tiles"), (ls.Settings, "map_tiles")],
    "GEOFENCE_SPARK_MASTER": [(session.JobConfig, "master")],
    "GEOFENCE_JDBC_JAR": [(session.JobConfig, "jdbc_jar")],
    "GEOFENCE_SPARK_PARTITIONS": [(session.JobConfig, "partitions")],
    "GEOFENCE_ARCHIVE_RETENTION_DAYS": [(archive_cmd.ArchiveOptions, "retention_days")],
    **{key: [(ls.Settings, name)] for key, (name, _) in ls._ENV_KEYS.items()
       if key not in ("GEOFENCE_REGIONS", "GEOFENCE_WORKERS", "GEOFENCE_API_PORT", "GEOFENCE_MAP_TILES")},
}


@pytest.mark.parametrize("key", sorted(CODE_DEFAULTS))
def test_the_registry_s_default_is_the_code_s(key: str) -> None:
    for cls, name in CODE_DEFAULTS[key]:
        assert reg.declared(key).default == _as_text(_defaults(cls)[name]), f"{cls.__name__}.{name}"


def test_the_defaults_checked_cover_the_process_keys() -> None:
    with_default = {s.name for s in reg.SETTINGS if s.default is not None}
    parsed = set(reg.SIDECAR_KEYS) | set(reg.keys_for("api", "spark", "stack"))
    assert with_default & parsed <= set(CODE_DEFAULTS)


# --------------------------------------------------------------------------- geofence settings


def test_docs_settings_md_is_generated_from_the_registry() -> None:
    on_disk = (ROOT / "docs" / "settings.md").read_text()
    assert on_disk == settings_cmd.markdown(), (
        f"docs/settings.md is not what the registry makes: regenerate it with `{settings_cmd.REGENERATE}`")


def test_geofence_settings_lists_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["settings"]) == 0
    out = capsys.readouterr().out
    assert all(re.search(rf"^{s.name}\b", out, re.M) for s in reg.SETTINGS)
    assert cli.main(["settings", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in doc["settings"]] == [s.name for s in reg.SETTINGS]
    assert set(doc["settings"][0]) == {"name", "type", "default", "roles", "secret", "description"}
    assert doc["roles"] == reg.ROLES
    assert cli.main(["settings", "--markdown"]) == 0
    md = capsys.readouterr().out
    assert md == settings_cmd.markdown()
    rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert len(rows) == len(reg.SETTINGS)
    assert all(line.count(" | ") == 5 for line in rows)  # no stray pipe in a cell


def test_the_keys_the_docs_and_units_name_are_declared() -> None:
    """README, ARCHITECTURE, docs/ and the systemd units name no key the registry lacks."""
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "deploy" / "systemd").iterdir())]
    found = sorted({f"{p.relative_to(ROOT)}: {k}" for p in files if p.is_file()
                    for k in DOC_KEY.findall(p.read_text())
                    if k not in reg.BY_NAME and k not in NOT_SETTINGS})
    assert found == [], "documented keys the registry does not declare:\n" + "\n".join(found)
