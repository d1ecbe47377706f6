"""Side by side with Tile38, in one run (issue 18): the same fleet-over-fences workload (the
fences and positions of bench/workload.py) through a Tile38 server and through our stack, and
the ratio of the two rates. The machine is shared and noisy: quote the ratio, not the rates.

    python -m bench.versus_tile38 [--fences 1000,10000] [--objects 10000] [--updates U]
        [--tile38 PATH] [--only tile38|ours]

Tile38 (../shared/anchors/tile38/tile38-server, built from its public repository; see its
README): started on a free loopback port with a data dir of its own, one
`SETCHAN <fence> WITHIN fleet FENCE DETECT enter,exit OBJECT <polygon>` per fence, then the
positions as `SET fleet <object> POINT <lat> <lon>`, pipelined in batches of --pipeline, while a
subscriber (`PSUBSCRIBE *`) counts the notifications. Its rate is updates over the time from
the first SET to the last notification (or the last SET reply, if later).

Ours: bench/e2e.py's amqp run against the running stack (`geofence up`): gateway batches of
--batch through x-ingress, x-geo and x-fence, durable and confirmed on every hop, events read
back and compared with the shapely reference. If the Tile38 binary is missing, this says so
and runs ours alone.

The RESP client is a few lines here (no Redis client library): commands are arrays of bulk
strings, replies are parsed as far as the benchmark reads them.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shapely.geometry import mapping

from bench import report
from bench import tenant as tn
from bench import workload as wl

ROOT = Path(__file__).resolve().parent.parent
TILE38 = ROOT.parent / "shared" / "anchors" / "tile38" / "tile38-server"
UPDATES = {1_000: 100_000, 10_000: 50_000}  # the sizes
START_TIMEOUT_S = 20.0
SETTLE_S = 2.0  # no notification for this long after the last SET reply: the run is over


# --------------------------------------------------------------------------- RESP


def encode(*args: str | bytes | int | float) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        raw = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


class Resp:
    """One connection: send raw commands, read replies (simple, error, integer, bulk, array)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def _line(self) -> bytes:
        while True:
            at = self.buf.find(b"\r\n")
            if at >= 0:
                line = bytes(self.buf[:at])
                del self.buf[:at + 2]
                return line
            self._fill()

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("tile38 closed the connection")
        self.buf += chunk

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n + 2]
        return data

    def reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(f"tile38: {rest.decode()}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError(f"tile38: unexpected reply {line[:80]!r}")

    def pipeline(self, commands: Sequence[bytes]) -> list[Any]:
        self.sock.sendall(b"".join(commands))
        return [self.reply() for _ in commands]


# --------------------------------------------------------------------------- Tile38


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tile38_server(binary: Path) -> Iterator[int]:
    """A Tile38 server on a free loopback port with a data dir of its own; stopped after."""
    data = Path(tempfile.mkdtemp(prefix="tile38-bench-"))
    port = free_port()
    log = (data / "server.log").open("wb")
    proc = subprocess.Popen([str(binary), "-h", "127.0.0.1", "-p", str(port), "-d", str(data / "db"), "-q"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                c = Resp(port)
                try:
                    if c.pipeline([encode("PING")])[0] in ("PONG", b"PONG"):
                        break
                finally:
                    c.close()
            except (OSError, RuntimeError, ConnectionError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tile38 did not start (see {data / 'server.log'})")
            time.sleep(0.05)  # the server's start-up: polled with a deadline
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(data, ignore_errors=True)


@dataclass
class Subscriber:
    """`PSUBSCRIBE *` on its own connection, in a thread: counts notifications by detect kind."""

    port: int
    count: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    last: float = 0.0
    ready: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    error: str = ""

    def run(self) -> None:
        c = Resp(self.port)
        c.sock.settimeout(0.2)
        try:
            c.sock.sendall(encode("PSUBSCRIBE", "*"))
            while not self.stop.is_set():
                try:
                    msg = c.reply()
                except TimeoutError:
                    continue
                if isinstance(msg, list) and msg and msg[0] == b"psubscribe":
                    self.ready.set()
                    continue
                if isinstance(msg, list) and len(msg) == 4 and msg[0] == b"pmessage":
                    self.count += 1
                    self.last = time.perf_counter()
                    with contextlib.suppress(ValueError, AttributeError):
                        self.note(json.loads(msg[3]))
        except Exception as exc:  # reported with the figures, never swallowed
            self.error = report.error_text(exc)
            self.ready.set()
        finally:
            c.close()

    def wait_quiet(self) -> None:
        """Until no notification came for SETTLE_S: the ones still in flight are in."""
        while True:
            seen = self.count
            time.sleep(SETTLE_S)  # a quiet period is the end of a run: measured, not synchronised
            if self.count == seen:
                return

    def note(self, notification: dict[str, Any]) -> None:
        """One notification (JSON): counted by detect kind."""
        kind = notification.get("detect", "?")
        self.kinds[kind] = self.kinds.get(kind, 0) + 1


@dataclass
class TileRun:
    fences: int
    updates: int
    updates_per_s: float
    notifications: int
    kinds: dict[str, int]
    setup_s: float
    stream_s: float


def run_tile38(binary: Path, fences: Sequence[wl.Fence], stream: wl.Stream, pipeline: int) -> TileRun:
    with tile38_server(binary) as port:
        c = Resp(port)
        try:
            t = time.perf_counter()
            chans = [encode("SETCHAN", f.fence_id, "WITHIN", "fleet", "FENCE", "DETECT", "enter,exit",
                            "OBJECT", json.dumps(mapping(f.geometry))) for f in fences]
            for lo in range(0, len(chans), pipeline):
                c.pipeline(chans[lo:lo + pipeline])
            setup_s = time.perf_counter() - t
            sub = Subscriber(port)
            thread = threading.Thread(target=sub.run, name="tile38-subscriber", daemon=True)
            thread.start()
            if not sub.ready.wait(10) or sub.error:
                raise RuntimeError(f"tile38 subscriber did not start: {sub.error}")
            ids = stream.object_ids
            lat, lon, obj = stream.lat.tolist(), stream.lon.tolist(), stream.obj.tolist()
            progress = report.Progress(f"tile38 F={len(fences):,}", len(stream))
            t0 = time.perf_counter()
            for lo in range(0, len(stream), pipeline):
                hi = min(lo + pipeline, len(stream))
                c.pipeline([encode("SET", "fleet", ids[obj[i]], "POINT", repr(lat[i]), repr(lon[i]))
                            for i in range(lo, hi)])
                progress.update(hi)
            sets_done = time.perf_counter()
            sub.wait_quiet()
            progress.close()
            sub.stop.set()
            thread.join(5)
            if sub.error:
                raise RuntimeError(f"tile38 subscriber: {sub.error}")
            end = max(sets_done, sub.last)
            return TileRun(len(fences), len(stream), len(stream) / (end - t0), sub.count, dict(sub.kinds),
                           setup_s, end - t0)
        finally:
            c.close()


# --------------------------------------------------------------------------- ours


def run_ours(f: int, n: int, u: int, batch: int, seed: int) -> Any:
    from bench import e2e

    args = argparse.Namespace(clients=1, no_idle_wait=False, no_park=False)
    w = e2e.Workloads(seed)
    return e2e.run_broker(args, w, e2e.Sizes(f, n, u, batch), "amqp", "amqp")


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.versus_tile38", description=__doc__.split("\n\n")[0])
    p.add_argument("--fences", default="1000,10000", help="fence counts, comma-separated (1000,10000)")
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--updates", type=int, help="updates per run (default: 100,000 at F=1,000, 50,000 at "
                                                 "F=10,000)")
    p.add_argument("--batch", type=int, default=1_000, help="our gateway batch (positions per message)")
    p.add_argument("--pipeline", type=int, default=500, help="Tile38 commands per pipelined write")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tile38", type=Path, default=TILE38, help=f"the server binary ({TILE38})")
    p.add_argument("--only", choices=("tile38", "ours"), help="run one side only")
    p.add_argument("--tls", action="store_true", help="our gateway over AMQPS with the stack's CA")
    a = p.parse_args(argv)
    try:
        a.fence_counts = [int(x) for x in a.fences.split(",") if x.strip()]
    except ValueError:
        p.error(f"--fences {a.fences!r}: comma-separated integers")
    for name in ("objects", "batch", "pipeline"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be positive")
    if a.updates is not None and a.updates < 1:
        p.error("--updates must be positive")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    tn.USE_TLS[0] = a.tls
    have_tile38 = a.tile38.is_file() and os.access(a.tile38, os.X_OK)
    if not have_tile38 and a.only != "ours":
        report.warn(f"no Tile38 binary at {a.tile38}: running ours alone")
    rows, summary, ratios = [], [], []
    for f in a.fence_counts:
        u = a.updates or UPDATES.get(f, 50_000)
        fences, stream = wl.make_fences(f, a.seed), wl.random_walk(a.objects, u, a.seed)
        reference = wl.reference_events(fences, stream)
        tile = None
        if have_tile38 and a.only != "ours":
            tile = run_tile38(a.tile38, fences, stream, a.pipeline)
        ours = None if a.only == "tile38" else run_ours(f, a.objects, u, a.batch, a.seed)
        ours_rate = None if ours is None or ours.error else ours.updates_per_s
        r = report.ratio(ours_rate, tile.updates_per_s if tile else None)
        ratios.append(r)
        ok = "-" if ours is None else ("error" if ours.error else ("yes" if not ours.diff else "NO"))
        rows.append([f"{f:,}", f"{a.objects:,}", f"{u:,}", f"{len(reference):,}",
                     f"{ours_rate:,.0f}" if ours_rate else (ours.error[:40] if ours and ours.error else "-"),
                     ok, f"{tile.updates_per_s:,.0f}" if tile else "-",
                     f"{tile.notifications:,}" if tile else "-", report.ratio_cell(r)])
        summary.append(f"F={f:,}: ours/Tile38 {report.ratio_cell(r)}x")
        if tile:
            print(f"tile38 F={f:,}: SETCHAN x{f:,} in {tile.setup_s:.1f} s; {u:,} SETs and their "
                  f"notifications in {tile.stream_s:.2f} s; notifications by kind {tile.kinds} "
                  f"(reference: {len(reference):,} events)", flush=True)
        if ours is not None and ours.notes:
            print("ours " + "; ".join(ours.notes), flush=True)
    print()
    print(report.table(["F", "N", "U", "ref events", "ours/s", "ours = ref", "tile38/s", "tile38 notif.",
                        "ratio"], rows))
    target_met = bool(ratios) and all(r is not None and r >= 1.0 for r in ratios)
    print(report.summary(summary, "OK" if target_met else "BELOW TARGET (>= 1.0x)", lead="versus Tile38"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
