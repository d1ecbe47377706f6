"""Sampling profiles of the running sidecars (py-spy), taken over one benchmark window: the
raw stacks per process, and the functions each spends its samples in (inclusive, the
event loop's own frames left out). Used by bench/capacity.py --profile.

py-spy reads another process's memory: it needs the same user (or root) and ptrace rights;
without them (or without py-spy) `Profiles.start` says so and profiles nothing.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

RATE_HZ = 100
LOOP_FRAMES = ("_run_module_as_main", "_run_code", "<module>", "main", "run", "run_until_complete",
               "run_forever", "_run_once", "_run", "select")  # the interpreter's and asyncio's own


class Profiles:
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.why_not = ""

    def start(self, pids: dict[str, int]) -> None:
        beside = Path(sys.executable).parent / "py-spy"  # the venv's, when it is not on PATH
        exe = str(beside) if beside.exists() else shutil.which("py-spy")
        if exe is None:
            self.why_not = "py-spy is not installed (pip install py-spy)"
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            self.procs[name] = subprocess.Popen(
                [exe, "record", "-p", str(pid), "-r", str(RATE_HZ), "-f", "raw", "--nonblocking",
                 "-o", str(self.out_dir / f"{name}.txt")], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)

    def stop(self, timeout: float = 30.0) -> None:
        """py-spy writes its file when interrupted."""
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)
        for p in self.procs.values():
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()

    def summaries(self, top: int = 12) -> dict[str, list[tuple[float, str]]]:
        return {name: top_functions(self.out_dir / f"{name}.txt", top) for name in self.procs
                if (self.out_dir / f"{name}.txt").exists()}


def top_functions(path: Path, top: int = 12) -> list[tuple[float, str]]:
    """(share of samples, "function file") for the functions most often on the stack."""
    seen_in: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        names = set()
        for frame in stack.split(";"):
            fn, _, where = frame.partition(" (")
            if fn.rsplit(".", 1)[-1] in LOOP_FRAMES:  # py-spy may qualify it: Class.method
                continue
            names.add(f"{fn} {where.rsplit('/', 1)[-1].split(':')[0]}")
        for name in names:
            seen_in[name] += int(n)
    return [(c / total, name) for name, c in seen_in.most_common(top)] if total else []
