"""One instance per routing role (issue 5): a second x-geo of a region, started while the
first runs, stands by: it never consumes (the first keeps the region's queues alone), says
so in its log, and ends cleanly on SIGTERM. Its lock is the exclusive queue lock.x-geo."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path

from deploy import sidecars
from deploy.settings import ConnectionSettings, Settings, load_secrets
from exchanges import topology as t
from tests.integration.clients import api

DEADLINE_S = 30.0


def consumers(stack: ConnectionSettings, vhost: str, queue: str) -> list[str]:
    """The connection names consuming `queue` (management API)."""
    got = api(stack, f"api/queues/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(queue, safe='')}")
    assert got is not None, f"queue {queue} not found in {vhost}"
    return [c["channel_details"]["connection_name"] for c in got.get("consumer_details", [])]


def lock_owner(stack: ConnectionSettings, vhost: str) -> str:
    """The connection holding the region's x-geo lock (the management API fills the owner's
    details a moment after a start: polled)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        lock = api(stack, f"api/queues/{urllib.parse.quote(vhost, safe='')}/{t.GEO_LOCK}")
        assert lock is None or lock["exclusive"]
        name = ((lock or {}).get("owner_pid_details") or {}).get("name")
        if name:
            return str(name)
        assert time.monotonic() < deadline, f"no x-geo holds {t.GEO_LOCK} in {vhost}: {lock}"
        time.sleep(0.2)


def test_a_second_x_geo_stands_by_and_consumes_nothing(stack: ConnectionSettings, tmp_path: Path
                                                       ) -> None:
    settings = Settings.from_env()
    region = settings.regions[0]
    vhost = t.region_vhost(region)
    owner = lock_owner(stack, vhost)
    before = consumers(stack, vhost, t.GEO_POSITIONS_QUEUE)
    assert len(before) == 1
    sc = sidecars.Sidecar("x-geo", region)
    env = {**os.environ, **sidecars.environment(settings, load_secrets(settings), sc)}
    log_path = tmp_path / "second.log"
    with open(log_path, "wb") as out:
        second = subprocess.Popen(sc.argv(), env=env, stdout=out, stderr=subprocess.STDOUT,
                                  cwd=str(sidecars.ROOT))
    try:
        deadline = time.monotonic() + DEADLINE_S
        while f"another instance holds {t.GEO_LOCK}" not in Path(log_path).read_text():
            assert second.poll() is None, Path(log_path).read_text()[-2000:]
            assert time.monotonic() < deadline, "the second x-geo never said it stands by:\n" + \
                Path(log_path).read_text()[-2000:]
            time.sleep(0.1)  # polling a log file: the only thing the second instance produces
        assert consumers(stack, vhost, t.GEO_POSITIONS_QUEUE) == before
        assert consumers(stack, vhost, t.GEO_CONTROL_QUEUE) and \
            consumers(stack, vhost, t.GEO_CONTROL_QUEUE)[0] == before[0]
        assert lock_owner(stack, vhost) == owner
    finally:
        second.send_signal(signal.SIGTERM)
        rc = second.wait(timeout=60)
    assert rc == 0, Path(log_path).read_text()[-2000:]
    assert "consuming" not in Path(log_path).read_text()
