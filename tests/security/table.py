"""The attack table: each attack test records one row (who tried what, what came back, and the
legitimate request beside it); the suite's conftest prints the table at the end of the run,
whatever the tests' outcomes, as the fault suite does."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    who: str  # outsider | other tenant's user | viewer | other tenant's device | ...
    attack: str  # what was tried
    answer: str  # what came back (a status, a refusal, what the reply held)
    legit: str  # the legitimate request beside it, and what it got
    ok: bool  # refused, nothing revealed, and the legitimate one worked


ROWS: list[Row] = []


def record(who: str, attack: str, answer: str, legit: str, ok: bool) -> None:
    ROWS.append(Row(who, attack, answer, legit, ok))


def table(rows: list[Row] | None = None, width: int = 60) -> list[str]:
    rows = ROWS if rows is None else rows
    head = ("who", "attack", "what came back", "beside it, the legitimate request", "holds")

    def cut(text: str) -> str:
        return text if len(text) <= width else text[: width - 1] + "…"

    body = [(r.who, cut(r.attack), cut(r.answer), cut(r.legit), "yes" if r.ok else "NO") for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    held = sum(r.ok for r in rows)
    return [
        fmt(head),
        "  ".join("-" * w for w in widths),
        *(fmt(b) for b in body),
        f"{held} of {len(rows)} rows hold",
    ]
