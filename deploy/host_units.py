"""`geofence host render`: what a host with systemd needs to run the pipeline's roles: the units
of deploy/systemd rendered for an install prefix and a settings directory, and each role's
environment file (mode 600) with its broker URL and credentials from the topology's secrets,
each file checked by the very parser the role reads it with (a missing or unknown key is
refused here, not at the first start on the host).

`geofence host install` renders the same files, then runs the plan's steps on this host, as
root, in order, stopping at the first that fails: the service user, the checkout under the
prefix with its virtualenv (which builds the C kernel) and the pages' npm packages, the env
files (mode 600) and the units in place, `daemon-reload`, `enable --now` of this host's units
(`--no-enable` leaves the last two to the operator; `--dry-run` prints the steps only).

Trade-off: the steps are the shell lines `render` prints, run one by one, so what an operator
reviews is what runs; they are idempotent where the tools are (`install -d`, `useradd` behind
`id -u`, `pip install -e`), and a second host runs the same command with GEOFENCE_HOST set to
the first host's address and the roles it runs (`--roles x-fence:w2`).
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

from deploy import sidecars, tls
from deploy.settings import Secrets, Settings, load_secrets, postgres_dsn, sidecar_amqp_url, sidecar_ids
from exchanges import shell
from exchanges import topology as t
from exchanges.broker_guard import ROLE as GUARD_ROLE
from exchanges.broker_guard import GuardConfig
from fence.api_server import ApiConfig
from spark_jobs.session import JobConfig

UNITS = Path(__file__).resolve().parent / "systemd"
ROOT = UNITS.parent.parent  # the checkout the install copies (`git archive HEAD`)
DEFAULT_PREFIX, DEFAULT_ETC = Path("/opt/geofence"), Path("/etc/geofence")
# local-stack settings a host must not get: the Auth emulator turns signature checks off, the
# journal dir and the state paths are the units' own (StateDirectory)
# (the API's HTTPS: that host's own certificate, or its TLS proxy: see the api unit's comment)
LOCAL_ONLY = ("FIREBASE_AUTH_EMULATOR_HOST", "GEOFENCE_JOURNAL_DIR", "GEOFENCE_MAP_ROADS",
              "GEOFENCE_API_TLS_LISTEN", "GEOFENCE_API_TLS_CERT", "GEOFENCE_API_TLS_KEY")
SPARK_ENV = "spark.env"
INSTANCED = ("x-geo", "x-fence")  # template units (@): one instance per region / worker
_FILE = re.compile(r"^EnvironmentFile=-?(\S+)$", re.M)


def render_unit(text: str, prefix: Path, etc: Path) -> str:
    return text.replace(str(DEFAULT_PREFIX), str(prefix)).replace(str(DEFAULT_ETC), str(etc))


def units(prefix: Path, etc: Path) -> dict[str, str]:
    """Every unit of deploy/systemd, rendered: file name -> text."""
    return {p.name: render_unit(p.read_text(), prefix, etc) for p in sorted(UNITS.iterdir())
            if p.suffix in (".service", ".timer")}


def env_file_names(unit_texts: Mapping[str, str]) -> set[str]:
    """The environment files the units read (instances' `%i` left as is)."""
    return {Path(m).name for text in unit_texts.values() for m in _FILE.findall(text)}


def parse_env(text: str) -> dict[str, str]:
    """An environment file as systemd reads it (KEY=VALUE lines, # comments)."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key:
            raise shell.ConfigError(f"line {n}: KEY=VALUE expected, got {line[:40]!r}")
        out[key.strip()] = value
    return out


def check(role: str, instance: str, env: Mapping[str, str]) -> None:
    """The role's own parser on `env`: a ConfigError for a missing, bad or unknown key."""
    if role == "api":
        ApiConfig.from_env(env)
    elif role == GUARD_ROLE:
        GuardConfig.from_env(env)
    elif role == "spark":
        JobConfig.from_env(env)
    else:
        shell.SidecarConfig.from_env(role, instance, env)


def environments(settings: Settings, pw: Secrets, roles: Sequence[tuple[str, str]] | None = None,
                 etc: Path = DEFAULT_ETC) -> dict[str, dict[str, str]]:
    """File name -> settings, for `roles` ((role, instance); default: every process of the
    topology, and the nightly jobs). A kind of role shares `<role>.env`; its instances' own
    metrics port goes to `<role>-<instance>.env`."""
    wanted = list(roles) if roles is not None else [*sidecar_ids(settings.topology, settings.ingress),
                                                    ("spark", ""), (GUARD_ROLE, "")]
    # a region or worker this host is to run before `geofence region / worker add` made it
    # part of the topology (render first, install, then add)
    new_r = tuple(dict.fromkeys(i for r, i in wanted if r == "x-geo" and i not in settings.regions))
    new_w = tuple(dict.fromkeys(i for r, i in wanted if r == "x-fence" and i not in settings.workers))
    if new_r or new_w:
        settings = replace(settings, regions=(*settings.regions, *new_r), workers=(*settings.workers, *new_w))
    files: dict[str, dict[str, str]] = {}
    for role, instance in wanted:
        if role == "spark":
            files[SPARK_ENV] = spark_environment(settings, pw)
            continue
        if role == GUARD_ROLE:  # on the broker's host: no credentials (it reads the store itself)
            files[f"{GUARD_ROLE}.env"] = {"GEOFENCE_GUARD_PORT": str(settings.guard_port),
                                          "GEOFENCE_GUARD_FAILED_LOGINS": f"{settings.guard_failed_logins:g}"}
            continue
        env = {k: v for k, v in sidecars.environment(settings, pw, sidecars.Sidecar(role, instance)).items()
               if k not in LOCAL_ONLY}
        metrics = env.pop("GEOFENCE_METRICS_LISTEN")
        user = sidecars.USERS[role]  # one file for every instance: named after the role
        env["GEOFENCE_AMQP_URL"] = sidecar_amqp_url(settings, user, pw.users[user], role)
        if instance:
            files.setdefault(f"{role}.env", env)
            own = {"GEOFENCE_METRICS_LISTEN": metrics}
            if role == "x-geo" and settings.broker_of(instance) != 1:  # its region's own node
                own["GEOFENCE_AMQP_URL"] = sidecar_amqp_url(settings, user, pw.users[user], role,
                                                            settings.broker_of(instance))
            files[f"{role}-{instance}.env"] = own
        else:
            files[f"{role}.env"] = {**env, "GEOFENCE_METRICS_LISTEN": metrics}
    # the stack's CA as the host has it (the plan installs it there): AMQPS, PostgreSQL's TLS
    local_ca, host_ca = str(settings.tls_ca_file), str(etc / "ca.pem")
    return {name: {k: v.replace(local_ca, host_ca).replace(quote(local_ca, safe=""), quote(host_ca, safe=""))
                   for k, v in env.items()} for name, env in files.items()}


def spark_environment(settings: Settings, pw: Secrets) -> dict[str, str]:
    amqp = sidecar_amqp_url(settings, t.MANAGER_USER, pw.users[t.MANAGER_USER], "spark")
    return {"GEOFENCE_POSTGRES_URL": postgres_dsn(settings, pw.postgres_password), "GEOFENCE_AMQP_URL": amqp,
            "GEOFENCE_REGIONS": ",".join(settings.regions), "GEOFENCE_WORKERS": ",".join(settings.workers),
            "GEOFENCE_SPARK_MASTER": "local[*]"}


def check_file(name: str, text: str, shared: Mapping[str, str] | None = None) -> None:
    """An environment file as its role will read it (an instance's file with its kind's shared
    one; a kind's shared file as its first instance would)."""
    stem, kind = name.removesuffix(".env"), _kind_file(name).removesuffix(".env")
    env = {**(shared or {}), **parse_env(text)}
    if kind in INSTANCED:
        key = "GEOFENCE_REGIONS" if kind == "x-geo" else "GEOFENCE_WORKERS"
        instance = stem[len(kind) + 1:] or env.get(key, "").split(",")[0]
        check(kind, instance, env)
    else:
        check(stem, "", env)


def write(out: Path, prefix: Path, etc: Path, files: Mapping[str, Mapping[str, str]],
          ca: Path | None = None) -> list[Path]:
    """The rendered units under out/units, the environment files (mode 600) under out/env,
    and the stack's CA beside them (`ca`)."""
    written = []
    (out / "units").mkdir(parents=True, exist_ok=True)
    env_dir = out / "env"
    env_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, text in units(prefix, etc).items():
        path = out / "units" / name
        path.write_text(text)
        written.append(path)
    for name, env in files.items():
        path = env_dir / name
        text = "".join(f"{k}={v}\n" for k, v in env.items())
        kind = _kind_file(name)
        check_file(name, text, files.get(kind) if kind != name else None)
        path.touch(mode=0o600)
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)
        path.write_text(text)
        written.append(path)
    if ca is not None:
        path = env_dir / "ca.pem"
        path.write_bytes(ca.read_bytes())
        written.append(path)
    return written


def _kind_file(name: str) -> str:
    """The shared file of an instance's file (x-geo-a.env -> x-geo.env); else the name itself."""
    for role in INSTANCED:
        if name.startswith(f"{role}-"):
            return f"{role}.env"
    return name


def plan(out: Path, prefix: Path, etc: Path, files: Mapping[str, object]) -> list[str]:
    """The commands that put the rendered files in place on the host (printed, not run)."""
    enable = []
    for name in sorted(files):
        stem, kind = name.removesuffix(".env"), _kind_file(name).removesuffix(".env")
        if stem == "spark":
            enable += ["geofence-spark-rebuild-bindings.timer", "geofence-spark-occupancy-analytics.timer",
                       "geofence-archive-months.timer"]
        elif kind != stem:
            enable.append(f"geofence-{kind}@{stem[len(kind) + 1:]}.service")
        elif stem not in INSTANCED:
            enable.append(f"geofence-{stem}.service")
    return [
        "id -u geofence >/dev/null 2>&1 || useradd --system --home-dir /var/lib/geofence "
        "--shell /usr/sbin/nologin geofence",
        f"install -d -m 755 {prefix} && git archive HEAD | tar -x -C {prefix}",
        f"python3 -m venv {prefix}/.venv && {prefix}/.venv/bin/pip install -q -c {prefix}/requirements.lock "
        f"-e '{prefix}{'[spark]' if 'spark.env' in files else ''}'"
        "   # builds the C kernel; the pinned versions",
        f"(cd {prefix}/fence/web && npm ci --no-audit --no-fund)   # the pages' JS libraries",
        f"install -d -m 700 {etc}   # systemd reads the files as root, before it drops to the user",
        f"install -m 600 {out}/env/*.env {etc}/",
        f"install -m 644 {out}/env/ca.pem {etc}/ca.pem   # the stack's CA: AMQPS and PostgreSQL's TLS",
        f"install -m 644 {out}/units/* /etc/systemd/system/",
        "systemctl daemon-reload",
        f"systemctl enable --now {' '.join(enable)}",
    ]


def parse_roles(raw: str) -> list[tuple[str, str]]:
    """`x-ingress,x-geo:a,x-fence:w0,api,spark,broker-guard` -> [(role, instance), ...]."""
    out = []
    for item in filter(None, (s.strip() for s in raw.split(","))):
        role, _, instance = item.partition(":")
        if role not in (*sidecars.USERS, "spark", GUARD_ROLE):
            raise shell.ConfigError(f"--roles: unknown role {role!r}")
        if (role in ("x-geo", "x-fence")) != bool(instance):
            raise shell.ConfigError(f"--roles: {role!r} " + ("needs :<instance>" if not instance
                                                              else "takes no instance"))
        out.append((role, instance))
    return out


def install(steps: Sequence[str], say: Callable[[str], None], dry_run: bool, enable: bool,
            runner: Callable[[str], int] | None = None) -> int:
    """Run the plan's steps on this host, in order, stopping at the first that fails (each
    is printed first; `dry_run`: printed only). Without `enable` the last two (daemon-reload,
    enable --now) are left to the operator. Returns the number of steps run."""
    todo = list(steps) if enable else list(steps[:-2])
    def in_bash(cmd: str) -> int:
        return subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=ROOT).returncode

    run_one = runner or in_bash
    for n, cmd in enumerate(todo, 1):
        say(f"[{n}/{len(todo)}] {cmd}")
        if dry_run:
            continue
        rc = run_one(cmd)
        if rc != 0:
            raise shell.ConfigError(f"step {n} failed (exit {rc}): {cmd}")
    if not enable:
        say("left to you: " + " && ".join(steps[-2:]))
    return 0 if dry_run else len(todo)


def has_systemd() -> bool:
    """systemd runs this machine (PID 1), so units can be enabled and started."""
    return Path("/run/systemd/system").is_dir()


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("action", choices=("render", "install"),
                        help="render: write the units and environment files; install: render them, then "
                             "run the steps that put them in place on this host (as root)")
    parser.add_argument("--dry-run", action="store_true", help="install: print the steps, run none")
    parser.add_argument("--no-enable", action="store_true",
                        help="install: put everything in place but leave daemon-reload and enable to you")
    parser.add_argument("--out", type=Path, required=True, help="directory to write units/ and env/ into")
    parser.add_argument("--prefix", type=Path, default=DEFAULT_PREFIX, help="install prefix (the checkout)")
    parser.add_argument("--etc", type=Path, default=DEFAULT_ETC, help="where the environment files go")
    parser.add_argument("--roles", help="comma-separated role[:instance] this host runs (default: all)")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    roles = parse_roles(args.roles) if args.roles else None
    files = environments(settings, load_secrets(settings), roles, args.etc)
    ca = tls.ensure(settings.state_dir, settings.host, settings.tls_dir).ca  # made here if need be
    written = write(args.out, args.prefix, args.etc, files, ca)
    print(f"{len(written)} files under {args.out} (env files mode 600: they hold passwords)")
    steps = plan(args.out, args.prefix, args.etc, files)
    if args.action == "render":
        print("then, on the host, as root:")
        for line in steps:
            print(f"  {line}")
        return 0
    enable = not args.no_enable
    if not args.dry_run:
        if os.geteuid() != 0:
            print("geofence host install: run it as root (it adds a user, writes /etc and the prefix)",
                  file=sys.stderr)
            return 2
        if enable and not has_systemd():
            print("geofence host install: systemd does not run this machine: use --no-enable (or --dry-run)",
                  file=sys.stderr)
            return 2
    try:
        done = install(steps, print, args.dry_run, enable)
    except shell.ConfigError as exc:
        print(f"geofence host install: {exc}", file=sys.stderr)
        return 1
    print(f"SUMMARY host install: {done} of {len(steps)} steps run" + (" (dry run)" if args.dry_run else ""))
    return 0
