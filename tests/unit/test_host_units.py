"""`geofence host render` (deploy/host_units.py): the units of deploy/systemd rendered for a
prefix pass `systemd-analyze verify` (the units as shipped, for /opt/geofence, do not here: the
check is real), and each role's environment file is complete, mode 600, and refused by the
role's own parser when it holds an unknown key or lacks one."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from deploy import host_units as h
from deploy.settings import Secrets, Settings
from exchanges import topology as t
from exchanges.shell import ConfigError

REPO = Path(__file__).resolve().parents[2]
SECRETS = Secrets("admin-pw", "pg-pw", {u: f"{u}-pw" for u in (
    t.INGRESS_USER, t.GEO_USER, t.FENCE_USER, t.MANAGER_USER, t.ARCHIVER_USER, t.VENUES_USER,
    t.WEBHOOKS_USER)})


def verify(path: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("systemd-analyze")
    assert binary, "systemd-analyze missing (Debian's systemd package)"
    return subprocess.run([binary, "verify", str(path)], capture_output=True, text=True, cwd=path.parent,
                          timeout=60)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("host")
    h.write(out, REPO, out / "etc", h.environments(Settings(), SECRETS))
    return out


def test_every_rendered_unit_passes_systemd_analyze_verify(rendered: Path) -> None:
    names = sorted(p.name for p in (rendered / "units").iterdir())
    assert names == sorted(p.name for p in h.UNITS.iterdir() if p.suffix in (".service", ".timer"))
    for path in sorted((rendered / "units").iterdir()):
        text = path.read_text()
        assert "/opt/geofence" not in text and "/etc/geofence" not in text, path.name
        done = verify(path)
        assert done.returncode == 0 and not done.stderr.strip(), (path.name, done.stderr)


def test_the_shipped_units_fail_where_their_prefix_is_missing(tmp_path: Path) -> None:
    shipped = tmp_path / "geofence-x-ingress.service"
    shipped.write_text((h.UNITS / "geofence-x-ingress.service").read_text())
    done = verify(shipped)
    assert done.returncode != 0 and "/opt/geofence/.venv/bin/geofence" in done.stderr


def test_each_env_file_a_unit_reads_is_written_complete_and_private(rendered: Path) -> None:
    settings = Settings()
    wanted = set()
    for name in h.env_file_names(h.units(REPO, rendered / "etc")):
        if "%i" in name:
            instances = settings.regions if name.startswith("x-geo") else settings.workers
            wanted |= {name.replace("%i", i) for i in instances}
        else:
            wanted.add(name)
    env_dir = rendered / "env"
    assert {p.name for p in env_dir.iterdir()} == wanted
    for path in env_dir.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path.name
        shared = env_dir / h._kind_file(path.name)
        h.check_file(path.name, path.read_text(), h.parse_env(shared.read_text()) if shared != path else None)
    api = h.parse_env((env_dir / "api.env").read_text())
    assert "FIREBASE_AUTH_EMULATOR_HOST" not in api  # it would turn the signature checks off
    assert api["GEOFENCE_AMQP_URL"].startswith(f"amqp://{t.MANAGER_USER}:{t.MANAGER_USER}-pw@")
    ingress = h.parse_env((env_dir / "x-ingress.env").read_text())
    assert re.fullmatch(r"amqp://x-ingress:x-ingress-pw@127\.0\.0\.1:5672/\?name=x-ingress",
                        ingress["GEOFENCE_AMQP_URL"])
    w1 = h.parse_env((env_dir / "x-fence-w1.env").read_text())
    assert w1 == {"GEOFENCE_METRICS_LISTEN": "127.0.0.1:9476"}
    assert h.parse_env((env_dir / "x-fence.env").read_text())["GEOFENCE_AMQP_URL"].endswith("?name=x-fence")


@pytest.mark.parametrize("name", ["x-ingress.env", "api.env", "spark.env", "x-geo.env", "venue-sensors.env"])
def test_an_unknown_or_a_missing_key_is_refused(rendered: Path, name: str) -> None:
    text = (rendered / "env" / name).read_text()
    with pytest.raises(ConfigError, match="GEOFENCE_TYPO"):
        h.check_file(name, text + "GEOFENCE_TYPO=1\n")
    for key in ("GEOFENCE_POSTGRES_URL", *(("GEOFENCE_AMQP_URL",) if name != "spark.env" else ())):
        without = "".join(line + "\n" for line in text.splitlines() if not line.startswith(key))
        with pytest.raises(ConfigError):
            h.check_file(name, without)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        h.check_file(name, text + "not a setting\n")


def test_roles_and_the_plan() -> None:
    roles = h.parse_roles("x-fence:w2, api")
    assert roles == [("x-fence", "w2"), ("api", "")]
    for bad in ("x-fence", "api:1", "nobody"):
        with pytest.raises(ConfigError, match="--roles"):
            h.parse_roles(bad)
    settings = Settings(workers=("w0", "w1", "w2"))
    files = h.environments(settings, SECRETS, roles)
    assert set(files) == {"x-fence.env", "x-fence-w2.env", "api.env"}
    steps = h.plan(Path("/tmp/out"), Path("/srv/gf"), Path("/etc/gf"), files)
    assert steps[-1] == "systemctl enable --now geofence-api.service geofence-x-fence@w2.service"
    assert "systemctl daemon-reload" in steps and any("install -m 600" in s for s in steps)


def test_install_runs_the_printed_steps_in_order_and_stops_at_a_failure(tmp_path: Path) -> None:
    steps = h.plan(tmp_path, Path("/opt/geofence"), Path("/etc/geofence"),
                   {"x-ingress.env": {}, "x-fence-w2.env": {}, "x-fence.env": {}})
    assert steps[-1].startswith("systemctl enable --now") and "geofence-x-fence@w2.service" in steps[-1]
    ran: list[str] = []
    said: list[str] = []
    assert h.install(steps, said.append, False, True, lambda cmd: ran.append(cmd) or 0) == len(steps)
    assert ran == steps and said[0].startswith(f"[1/{len(steps)}] id -u geofence")
    ran.clear()
    assert h.install(steps, said.append, False, False, lambda cmd: ran.append(cmd) or 0) == len(steps) - 2
    assert ran == steps[:-2] and "systemctl daemon-reload" in said[-1]  # left to the operator
    ran.clear()
    assert h.install(steps, said.append, True, True, lambda cmd: ran.append(cmd) or 0) == 0 and not ran

    def fail_third(cmd: str) -> int:
        ran.append(cmd)
        return 3 if len(ran) == 3 else 0

    with pytest.raises(ConfigError, match="step 3 failed"):
        h.install(steps, said.append, False, True, fail_third)
    assert ran == steps[:3]  # nothing after the failure


def test_a_second_host_reaches_the_first_over_tls(tmp_path: Path) -> None:
    settings = Settings(host="10.0.0.5", state_dir=tmp_path)
    files = h.environments(settings, SECRETS, [("x-fence", "w2"), ("api", "")], Path("/etc/gf"))
    ingress_url = files["x-fence.env"]["GEOFENCE_AMQP_URL"]
    assert ingress_url.startswith("amqps://x-fence:x-fence-pw@10.0.0.5:5671/?")
    assert "cafile=%2Fetc%2Fgf%2Fca.pem" in ingress_url
    dsn = files["api.env"]["GEOFENCE_POSTGRES_URL"]
    assert dsn.endswith("sslmode=verify-full&sslrootcert=/etc/gf/ca.pem")
    assert not any(k.startswith("GEOFENCE_API_TLS") for k in files["api.env"])
    out = tmp_path / "out"
    written = h.write(out, REPO, Path("/etc/gf"), files, h.tls.ensure(tmp_path, settings.host).ca)
    assert out / "env" / "ca.pem" in written
    steps = h.plan(out, REPO, Path("/etc/gf"), files)
    assert any("install -m 644" in s and "/etc/gf/ca.pem" in s for s in steps)
