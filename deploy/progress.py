"""Progress of a long command on stderr: a bar with its rate and time left (tqdm) when stderr
is a terminal, else the command's own lines, one per step, as logs and pipes want them."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from types import TracebackType

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, what: str, unit: str) -> None:
        self.bar = tqdm(total=total, desc=what, unit=f" {unit}", file=sys.stderr, dynamic_ncols=True,
                        mininterval=0.2, disable=not sys.stderr.isatty())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.bar.close()

    def say(self, line: str) -> None:
        """A step's line: printed when there is no bar (the bar says it otherwise)."""
        if self.bar.disable:
            print(line, file=sys.stderr, flush=True)

    def write(self, line: str) -> None:
        """A line of the command's output (stdout), above the bar when there is one."""
        if self.bar.disable:
            print(line, flush=True)
        else:
            tqdm.write(line, file=sys.stdout)

    def to(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.update(done - self.bar.n)


class Steps:
    """A live operation's progress (`region add`, `worker remove`, `ingress add` ...): each line
    the operation says is a step. On a terminal, a bar of steps with the time elapsed and left,
    the lines printed above it; elsewhere the lines alone, as before. How many steps an
    operation takes is learned: the count of its last successful run (state dir,
    progress.json, by operation), so the first run shows steps and time without an end, and
    the next ones their ETA."""

    def __init__(self, what: str, key: str, record: Path, prefix: str) -> None:
        self.key, self.record, self.prefix = key, record, prefix
        total = _learned(record).get(key)
        self.bar = tqdm(total=total, desc=what, unit=" step", file=sys.stderr, dynamic_ncols=True,
                        mininterval=0.2, disable=not sys.stderr.isatty())
        self.done = 0

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.bar.close()
        if kind is None and self.done:
            learned = _learned(self.record)
            learned[self.key] = self.done
            with contextlib.suppress(OSError):
                self.record.write_text(json.dumps(learned, indent=2, sort_keys=True) + "\n")

    def say(self, text: str) -> None:
        self.done += 1
        line = f"{self.prefix}: {text}"
        if self.bar.disable:
            print(line, flush=True)
            return
        tqdm.write(line, file=sys.stdout)
        if self.bar.total is not None and self.done > self.bar.total:
            self.bar.total = self.done
        self.bar.update(1)


def _learned(record: Path) -> dict[str, int]:
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else {}
