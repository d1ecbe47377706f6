"""What the benchmarks' command lines share.

A benchmark is a module of the `bench` package: it imports the others as `from bench import
workload as wl`, which works when it runs as `python -m bench.<name>` from the repository's
root (or anywhere with the repository on PYTHONPATH). Run as a file (`python
bench/<name>.py`), its folder, not the repository, is the first entry of the import path, so
before its imports a benchmark hands over to `run_as_module`:

    if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
        import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

        cli.run_as_module(__file__)

which runs the same interpreter again, with the same arguments and working directory, as
`-m bench.<name>` with the repository first on PYTHONPATH (as deploy/sidecars.py starts the
sidecars). Nothing here touches sys.path.

`require_positive`: the options that must be above zero, checked as argparse errors.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn


def run_as_module(file: str) -> NoReturn:
    """Replace this process by `python -m bench.<stem of file> <the same arguments>`."""
    path = Path(file).resolve()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path.parent.parent), env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", f"{path.parent.name}.{path.stem}", *sys.argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def require_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, names: Iterable[str]) -> None:
    """parser.error unless each of these options, if given (not None), is above zero."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name} must be positive")
