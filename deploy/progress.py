"""Progress of a long command on stderr: a bar with its rate and time left (tqdm) when stderr
is a terminal, else the command's own lines, one per step, as logs and pipes want them."""

from __future__ import annotations

import sys
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
