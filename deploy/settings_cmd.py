"""`geofence settings`: every environment variable the project reads (the registry,
exchanges/settings_registry.py): its type, default, the processes that read it, whether it is
secret, what it does. `--markdown` prints docs/settings.md (generated from it, checked by
tests/unit/test_settings_registry.py), `--json` the same for tools. Reads no environment.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from exchanges import settings_registry as reg

REGENERATE = ".venv/bin/geofence settings --markdown > docs/settings.md"
WIDTH = 100


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true",
                     help="docs/settings.md: a short introduction and a Markdown table")
    out.add_argument("--json", action="store_true", help="the roles and the settings as JSON")


def as_json() -> dict[str, Any]:
    return {"roles": dict(reg.ROLES),
            "settings": [{"name": s.name, "type": s.type, "default": s.default, "roles": list(s.roles),
                          "secret": s.secret, "description": s.description} for s in reg.SETTINGS]}


def text() -> str:
    """One line per setting (name, type, default, secret), its roles and description below it."""
    rows = [("NAME", "TYPE", "DEFAULT", "SECRET")]
    rows += [(s.name, s.type, "-" if s.default is None else s.default, "yes" if s.secret else "")
             for s in reg.SETTINGS]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[3]]).rstrip())
        if i:
            s = reg.SETTINGS[i - 1]
            lines += textwrap.wrap(f"roles: {', '.join(s.roles)}", WIDTH, initial_indent="    ",
                                   subsequent_indent="      ")
            lines += textwrap.wrap(s.description, WIDTH, initial_indent="    ", subsequent_indent="    ")
    lines += ["", "roles:"]
    for role, what in reg.ROLES.items():
        lines += textwrap.wrap(what, WIDTH, initial_indent=f"  {role:<15}", subsequent_indent=" " * 17)
    return "\n".join(lines)


def _cell(value: str) -> str:
    """`value` in a table cell: pipes escaped, and < > outside `code` (else markup)."""
    parts = value.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def markdown() -> str:
    """docs/settings.md."""
    lines = [
        "# Settings",
        "",
        f"<!-- Generated from exchanges/settings_registry.py by `geofence settings --markdown`: do not "
        f"edit, regenerate with `{REGENERATE}`. -->",
        "",
        "Every environment variable the project reads, declared once in "
        "`exchanges/settings_registry.py`. Each process builds its settings once, in its `main`, "
        "and refuses a `GEOFENCE_*` key that no part of it knows (a typo fails loudly, with the "
        "nearest known key); every sidecar accepts the keys of every sidecar role. A *secret* "
        "value holds a password and is only ever shown masked. `geofence settings` prints this "
        "table (`--json` for tools). The roles:",
        "",
        *(f"- `{role}`: {what}" for role, what in reg.ROLES.items()),
        "",
        "| name | type | default | roles | secret | description |",
        "|---|---|---|---|---|---|",
    ]
    for s in reg.SETTINGS:
        default = "" if s.default is None else f"`{_cell(s.default)}`"
        lines.append(f"| `{s.name}` | {_cell(s.type)} | {default} | {', '.join(s.roles)} | "
                     f"{'yes' if s.secret else ''} | {_cell(s.description)} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        print(markdown(), end="")
    elif args.json:
        print(json.dumps(as_json(), indent=2))
    else:
        print(text())
    return 0
