"""Prometheus in the local stack (Debian's `prometheus` 2.x, installed by deploy/setup.sh):
it scrapes every sidecar's /metrics (exchanges/shell/metrics.py, ports from
`Settings.metrics_ports`) and RabbitMQ's rabbitmq_prometheus plugin, and evaluates the alert
rules of deploy/prometheus/rules.yml.

<state dir>/prometheus/ holds its copy of deploy/prometheus/{prometheus.yml,rules.yml}, the
two target files (file_sd, rewritten at every `geofence up`: Prometheus rereads them by
itself) and its data (data/, 7 days). Its web API and UI: `prometheus` in `geofence status`.
A changed rules file or config reaches a running Prometheus by its reload endpoint.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from deploy.processes import ProcessId, StackError, identify, port_open, terminate, wait_until
from deploy.settings import METRICS_HOST, Secrets, Settings

SOURCE = Path(__file__).resolve().parent / "prometheus"
FILES = ("prometheus.yml", "rules.yml")
RETENTION = "7d"


def prometheus_dir(settings: Settings) -> Path:
    return settings.state_dir / "prometheus"


def targets(settings: Settings) -> dict[str, list[dict[str, object]]]:
    """The file_sd target files' contents: file name -> target groups."""
    h = settings.host
    return {
        "targets-geofence.json": [
            {"targets": [f"{METRICS_HOST}:{port}"], "labels": {"name": name}}
            for name, port in {**settings.metrics_ports(), "broker-guard": settings.guard_port}.items()],
        "targets-rabbitmq.json": [{"targets": [f"{h}:{settings.rabbitmq_metrics_port}"],
                                   "labels": {"name": "rabbitmq"}}],
    }


def write_config(settings: Settings) -> bool:
    """The config, rules and targets into the state dir; True when the config or the rules
    changed (a running Prometheus must reload them; targets it rereads by itself)."""
    out = prometheus_dir(settings)
    out.mkdir(parents=True, exist_ok=True)
    changed = False
    for name in FILES:
        text = (SOURCE / name).read_text()
        target = out / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            changed = True
    for name, groups in targets(settings).items():
        text = json.dumps(groups, indent=2) + "\n"
        target = out / name
        if not target.exists() or target.read_text() != text:
            tmp = target.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(target)  # Prometheus never reads half a file
    return changed


def running(settings: Settings) -> bool:
    return port_open(settings.host, settings.prometheus_port)


def launch(settings: Settings) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        raise StackError("prometheus not found: run `bash deploy/setup.sh` (Debian's package prometheus)")
    write_config(settings)
    d = prometheus_dir(settings)
    log = settings.log_dir / "prometheus.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [binary, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
            f"--storage.tsdb.retention.time={RETENTION}",
            f"--web.listen-address={settings.host}:{settings.prometheus_port}", "--web.enable-lifecycle"]
    # detached as the Auth emulator is (deploy/firebase_emulator.py): not our child, survives us
    script = 'log=$1; pidfile=$2; shift 2; "$@" >>"$log" 2>&1 </dev/null & echo $! >"$pidfile"'
    try:
        subprocess.run(["/bin/sh", "-c", script, "sh", str(log), str(d / "prometheus.pid"), *argv],
                       cwd=d, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=True,
                       start_new_session=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise StackError(f"cannot launch prometheus: {exc}") from exc


def _ready(settings: Settings) -> bool:
    try:
        with urllib.request.urlopen(f"http://{settings.host}:{settings.prometheus_port}/-/ready",
                                    timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def await_started(settings: Settings) -> ProcessId:
    wait_until(lambda: _ready(settings), settings.start_timeout,
               f"prometheus on {settings.host}:{settings.prometheus_port} "
               f"(log {settings.log_dir}/prometheus.log)")
    return identify(int((prometheus_dir(settings) / "prometheus.pid").read_text().strip()))


def configure(settings: Settings, pw: Secrets, started_now: bool) -> None:
    """Targets for this topology; a changed config or rules file reloaded."""
    if write_config(settings) and not started_now:
        request = urllib.request.Request(f"http://{settings.host}:{settings.prometheus_port}/-/reload",
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except (urllib.error.URLError, OSError) as exc:
            raise StackError(f"prometheus did not reload its configuration: {exc}") from None


def stop(settings: Settings, proc: ProcessId) -> None:
    terminate(proc, settings.start_timeout, "prometheus")
