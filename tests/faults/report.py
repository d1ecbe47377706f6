"""The fault suite's table: each fault test records one row; the suite's conftest prints the
table at the end of the run (pytest_terminal_summary), whatever the outcome of the tests."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    fault: str  # what was done, e.g. "kill -9 x-fence-w0 (x3)"
    injected: int  # faults injected in the run
    updates: int  # positions sent
    expected: int  # events of the shapely ground truth
    received: int  # distinct event_ids received
    duplicates: int  # raw deliveries minus distinct event_ids
    dlq: int  # messages that went to the dead-letter queues during the run
    recovery_s: tuple[float, ...] = field(default=())  # per fault: until the pipeline flowed again
    ok: bool = True  # the run's assertions held
    # events pairing a fence (or a subscription) with another tenant's object, on the wire or in
    # the archive (None: the run has no tenants to cross, e.g. the fuzzed inputs)
    crossed: int | None = None


ROWS: list[Row] = []


def record(row: Row) -> None:
    ROWS.append(row)


def table(rows: list[Row] | None = None) -> list[str]:
    rows = ROWS if rows is None else rows
    head = ("fault", "injected", "updates", "expected", "received", "dup", "dlq", "x-tenant",
            "recovery s (max)", "ok")
    body = []
    for r in rows:
        rec = (f"{', '.join(f'{s:.1f}' for s in r.recovery_s[:6])}{' …' if len(r.recovery_s) > 6 else ''}"
               f" ({max(r.recovery_s):.1f})" if r.recovery_s else "-")
        body.append((r.fault, f"{r.injected:,}", f"{r.updates:,}", f"{r.expected:,}", f"{r.received:,}",
                     f"{r.duplicates:,}", f"{r.dlq:,}", "-" if r.crossed is None else f"{r.crossed:,}", rec,
                     "yes" if r.ok else "NO"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return [fmt(head), "  ".join("-" * w for w in widths), *(fmt(b) for b in body)]
