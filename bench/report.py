"""How the benchmarks print their figures.

Every benchmark prints the same kinds of things, all from here:
- tables (`table`): a header and rows of strings, each column as wide as its widest cell, the
  first column left-aligned and the others right-aligned; `side_by_side`: a column per run
  (or per system: ours and a named reference such as Tile38), a row per figure;
- ratios (`ratio`, `ratio_cell`, `times`): a figure over its target or over a named reference,
  >= 1 meets it or is ahead of it (`lower_is_better` for times and latencies), written "1.23"
  in a table and "1.23x target 5,000/s" or "2,266x hilbertcurve" in a sentence;
- the summary at the end (`summary`): one line, "SUMMARY[ verdict]: [lead: ]part; part; ...",
  (`summary_block` for a benchmark whose summary gathers the lines of several processes);
- progress (`Progress`, `every`, `warn`): one stderr line rewritten in place while a run goes
  on, and warnings on stderr, so stdout holds the figures only;
- figure helpers (`pct`, `fmt`, `error_text`): a percentile of a possibly empty sample, a
  figure that may be missing ("-"), an exception as one short line.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

WIDTH = 119  # a progress line is cut here (and padded to 79), and `Progress.close` clears this much


# --------------------------------------------------------------------------- tables


def table(header: Sequence[str], rows: Iterable[Sequence[str]], first_left: bool = True,
          indent: str = "") -> str:
    """The header and the rows, columns as wide as their widest cell and two spaces apart;
    the first column left-aligned (unless not first_left), the others right-aligned."""
    lines = [list(header), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return indent + "  ".join(c.ljust(wd) if i == 0 and first_left else c.rjust(wd)
                                  for i, (c, wd) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join(line(r) for r in lines)


def side_by_side(labels: Sequence[str], columns: Sequence[Mapping[str, str]], order: Iterable[str] = ()
                 ) -> str:
    """A column per run (labels[i] over columns[i]: figure name -> value), a row per figure:
    first the names in `order` that some column has, then the others in the order the columns
    give them; "-" where a column lacks a figure."""
    names = [n for n in order if any(n in c for c in columns)]
    names += [n for n in dict.fromkeys(k for c in columns for k in c) if n not in names]
    return table(["", *labels], [[n, *(c.get(n, "-") for c in columns)] for n in names])


# --------------------------------------------------------------------------- ratios


def ratio(figure: float | None, reference: float | None, lower_is_better: bool = False) -> float | None:
    """figure / reference (reference / figure if lower_is_better): >= 1 meets or beats the
    reference. None when the division means nothing (a missing, zero or NaN operand)."""
    if figure is None or reference is None or math.isnan(figure) or not reference > 0:
        return None
    if lower_is_better:
        return reference / figure if figure > 0 else None
    return figure / reference


def ratio_cell(r: float | None, spec: str = ".2f") -> str:
    """A ratio in a table: "1.23", or "-" without one."""
    return "-" if r is None else format(r, spec)


def times(r: float | None, reference: str = "", spec: str = ".2f") -> str:
    """A ratio in a sentence: "1.23x" and, named, "1.23x target 5,000/s"; "-" without one."""
    if r is None:
        return "-"
    return f"{r:{spec}}x" + (f" {reference}" if reference else "")


# --------------------------------------------------------------------------- figures


def pct(values: Sequence[float] | npt.NDArray[np.float64], q: float) -> float:
    """The q-th percentile, NaN for no values."""
    a = np.asarray(values, dtype=float)
    return float(np.percentile(a, q)) if a.size else math.nan


def fmt(value: float, spec: str = ",.1f") -> str:
    """A figure, "-" for NaN (none measured)."""
    return "-" if math.isnan(value) else format(value, spec)


def error_text(exc: BaseException, limit: int = 200) -> str:
    """An exception as the first line of "Type: message", at most `limit` characters."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:limit]


# --------------------------------------------------------------------------- the summary


def summary(parts: Iterable[str], verdict: str = "", lead: str = "") -> str:
    """The one line a benchmark ends with: "SUMMARY[ verdict]: [lead: ]part; part; ..."."""
    head = "SUMMARY" + (f" {verdict}" if verdict else "") + ": " + (f"{lead}: " if lead else "")
    return head + "; ".join(parts)


def summary_block(title: str, lines: Iterable[str]) -> str:
    """A summary over several lines: "SUMMARY title:" and the lines below it, indented."""
    return "\n".join([f"SUMMARY {title}:", *("  " + x for x in lines)])


# --------------------------------------------------------------------------- progress


class Progress:
    """One stderr line, rewritten (at most every half second by `update`): "  label: text",
    with the seconds since the start after it if `clock`."""

    def __init__(self, label: str, total: int = 0, clock: bool = False) -> None:
        self.label, self.total, self.clock = label, total, clock
        self.t0 = self.shown = time.perf_counter()
        self.phase, self.phase_t0 = "", self.t0

    def update(self, done: int) -> None:
        """done of total updates, with the rate."""
        now = time.perf_counter()
        if now - self.shown < 0.5 and done < self.total:
            return
        self.shown = now
        rate = done / (now - self.t0) if now > self.t0 else 0.0
        self.show(f"{done:,}/{self.total:,} updates, {rate:,.0f}/s")

    def phase_update(self, phase: str, done: int, total: int) -> None:
        """For broker_modes.run: (phase, done, total) every half second."""
        now = time.perf_counter()
        if phase != self.phase:
            self.phase, self.phase_t0 = phase, now
        dt = now - self.phase_t0
        rate = f", {done / dt:,.0f}/s" if dt > 0 and total else ""
        count = f" {done:,}/{total:,}{rate}" if total else ""
        if phase == "drain":  # done: the pipeline's backlog (messages)
            phase, count = "waiting for an idle pipeline", f" (backlog {done:,})" if done else ""
        self.show(f"{phase}{count}, {dt:.0f} s (run {now - self.t0:.0f} s)")

    def show(self, text: str) -> None:
        clock = f" ({time.perf_counter() - self.t0:.0f} s)" if self.clock else ""
        print(f"\r  {self.label}: {text}{clock}".ljust(79)[:WIDTH], end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Clear the line (the figures that follow start on a clean one)."""
        print("\r" + " " * WIDTH + "\r", end="", file=sys.stderr, flush=True)


async def every(seconds: float, show: Callable[[], None]) -> None:
    """show() every `seconds`, until cancelled (a progress ticker)."""
    while True:
        show()
        await asyncio.sleep(seconds)


def warn(text: str) -> None:
    """A warning on stderr, on a line of its own (below a progress line)."""
    print(f"\n  ! {text}", file=sys.stderr)
