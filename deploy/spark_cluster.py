"""`geofence spark cluster up|down|status`: a Spark standalone cluster on this machine, a master
and one worker started from the pyspark package's own launcher (`spark-class
org.apache.spark.deploy.master.Master` / `...worker.Worker`), for the nightly jobs to be
submitted to with `--master spark://127.0.0.1:7077` as they would be to a real cluster.

Trade-off: not part of `geofence up`. Two JVMs hold ~1 GB and the jobs run in local mode by
default; a cluster is what production uses and what the tests check the jobs against, so it is
started when wanted. The master and worker are detached (not children of this command), their
pids kept in <state dir>/spark/ and their logs in the log dir, as for Prometheus.

Executors import the project: they run the driver's Python (`spark.pyspark.python`, the
virtualenv where the project and its C kernel are installed). On other machines, workers need
the same checkout and virtualenv at the same path (docs/reference.md, "Spark on a cluster").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from deploy.processes import (
    ProcessId,
    StackError,
    identify,
    port_open,
    process_identity,
    terminate,
    wait_until,
)
from deploy.settings import Settings

MASTER_PORT = 7077
MASTER_UI_PORT = 8090  # 8080 is the API's
WORKER_UI_PORT = 8091
WORKER_MEMORY = "2g"
ROLES = ("master", "worker")
CLASSES = {"master": "org.apache.spark.deploy.master.Master",
           "worker": "org.apache.spark.deploy.worker.Worker"}


def spark_home() -> Path:
    import pyspark  # the package carries Spark's jars and launchers

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise StackError(f"no bin/spark-class under {home}: the pyspark package is incomplete")
    return home


def master_url(settings: Settings) -> str:
    return f"spark://{settings.host}:{MASTER_PORT}"


def cluster_dir(settings: Settings) -> Path:
    return settings.state_dir / "spark"


def environment(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": settings.host,
                "SPARK_LOG_DIR": str(settings.log_dir), "SPARK_NO_DAEMONIZE": "1",
                # finished applications' directories (jars, logs) go after a week
                "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=true "
                                     "-Dspark.worker.cleanup.appDataTtl=604800"})
    if shutil.which("java") is None:
        raise StackError("java not found: run `bash deploy/setup.sh` (Debian's default-jre-headless)")
    return env


def argv(settings: Settings, role: str) -> list[str]:
    base = [str(spark_home() / "bin" / "spark-class"), CLASSES[role], "--host", settings.host]
    if role == "master":
        return [*base, "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT)]
    work = cluster_dir(settings) / "work"
    work.mkdir(parents=True, exist_ok=True)
    return [*base, "--cores", str(os.cpu_count() or 2), "--memory", WORKER_MEMORY,
            "--webui-port", str(WORKER_UI_PORT), "--work-dir", str(work), master_url(settings)]


def master_state(settings: Settings) -> dict[str, Any] | None:
    """The master's own view (its web UI's /json): workers, cores, applications; None if down."""
    try:
        with urllib.request.urlopen(f"http://{settings.host}:{MASTER_UI_PORT}/json/", timeout=2) as r:
            state: dict[str, Any] = json.load(r)
            return state
    except (urllib.error.URLError, OSError, ValueError):
        return None


def alive_workers(settings: Settings) -> int:
    state = master_state(settings)
    return 0 if state is None else sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


def _pid_file(settings: Settings, role: str) -> Path:
    return cluster_dir(settings) / f"{role}.pid"


def recorded(settings: Settings, role: str) -> ProcessId | None:
    """The role's process if it still runs as the very process started (its identity kept)."""
    try:
        pid, start = _pid_file(settings, role).read_text().split()
    except (OSError, ValueError):
        return None
    proc = ProcessId(int(pid), int(start))
    return proc if process_identity(proc.pid) == proc else None


def _launch(settings: Settings, role: str) -> ProcessId:
    log = settings.log_dir / f"spark-{role}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file = cluster_dir(settings) / f"{role}.launch"
    script = 'log=$1; pidfile=$2; shift 2; "$@" >>"$log" 2>&1 </dev/null & echo $! >"$pidfile"'
    try:
        subprocess.run(["/bin/sh", "-c", script, "sh", str(log), str(pid_file), *argv(settings, role)],
                       cwd=cluster_dir(settings), env=environment(settings), stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=30, check=True, start_new_session=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise StackError(f"cannot launch the Spark {role}: {exc}") from exc
    proc = identify(int(pid_file.read_text().strip()))
    _pid_file(settings, role).write_text(f"{proc.pid} {proc.start_ticks}\n")
    return proc


def up(settings: Settings, say: Any = print) -> None:
    cluster_dir(settings).mkdir(parents=True, exist_ok=True)
    if port_open(settings.host, MASTER_PORT):
        say(f"spark master: already running ({master_url(settings)})")
    else:
        proc = _launch(settings, "master")
        wait_until(lambda: master_state(settings) is not None, settings.start_timeout,
                   f"the Spark master on {settings.host}:{MASTER_UI_PORT} "
                   f"(log {settings.log_dir}/spark-master.log)")
        say(f"spark master: started (pid {proc.pid}, {master_url(settings)}, UI http://{settings.host}:"
            f"{MASTER_UI_PORT})")
    if alive_workers(settings):
        say(f"spark worker: already registered ({alive_workers(settings)} alive)")
    else:
        proc = _launch(settings, "worker")
        wait_until(lambda: alive_workers(settings) > 0, settings.start_timeout,
                   f"a Spark worker registered with the master (log {settings.log_dir}/spark-worker.log)")
        say(f"spark worker: started (pid {proc.pid}, {os.cpu_count() or 2} cores, {WORKER_MEMORY})")


def down(settings: Settings, say: Any = print) -> None:
    for role in reversed(ROLES):
        proc = recorded(settings, role)
        if proc is None:
            say(f"spark {role}: not running (as started by `geofence spark cluster up`)")
            continue
        say(f"spark {role}: stopping (pid {proc.pid})")
        terminate(proc, settings.start_timeout, f"the Spark {role}")
        _pid_file(settings, role).unlink(missing_ok=True)


def status(settings: Settings, say: Any = print) -> int:
    state = master_state(settings)
    if state is None:
        say(f"spark master: down ({master_url(settings)})")
        return 1
    workers = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
    say(f"spark master: {state.get('status', '?')} at {master_url(settings)}, UI http://{settings.host}:"
        f"{MASTER_UI_PORT}; {len(workers)} worker(s) alive, {sum(w.get('cores', 0) for w in workers)} cores, "
        f"{len(state.get('activeapps', []))} application(s) running")
    return 0 if workers else 1


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("action", choices=("up", "down", "status"),
                        help="start the master and a worker / stop them / show them")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.action == "up":
        up(settings)
        print(f"submit with: geofence spark <job> --master {master_url(settings)}")
        return 0
    if args.action == "down":
        down(settings)
        return 0
    return status(settings)
