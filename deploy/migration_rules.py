"""A rule for the migrations (deploy/migrations/) that keeps `geofence up` from locking a busy
table for a scan: a CHECK or FOREIGN KEY added to an existing table is added `NOT VALID` (a
moment's lock: only new rows are checked) and validated by a later file (`VALIDATE CONSTRAINT`
scans under a lock that lets reads and writes go on). Each file is one transaction, so the
validation must be in another file, or the first file's lock is held through the scan. A column
made NOT NULL the same way: a validated `CHECK (c IS NOT NULL)` first, then `SET NOT NULL` (it
trusts the check instead of scanning).

Files before FIRST_CHECKED predate the rule (they ran on small tables, or already ran).
"""

from __future__ import annotations

import re

FIRST_CHECKED = 28
_STATEMENTS = re.compile(r";\s*(?:--[^\n]*\n\s*)*")
_ALTER = re.compile(r"\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?([\w.\"]+)", re.I)
_ADD_CONSTRAINT = re.compile(r"\bADD\s+CONSTRAINT\s+([\w\"]+)\s+(CHECK|FOREIGN\s+KEY)", re.I)
_ADD_COLUMN_CHECKED = re.compile(r"\bADD\s+COLUMN\b[^,]*\b(REFERENCES|CHECK)\b", re.I)
_VALIDATE = re.compile(r"\bVALIDATE\s+CONSTRAINT\s+([\w\"]+)", re.I)
_SET_NOT_NULL = re.compile(r"\bALTER\s+COLUMN\s+([\w\"]+)\s+SET\s+NOT\s+NULL", re.I)
_CREATED = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([\w.\"]+)", re.I)


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def lock_problems(files: dict[int, str]) -> list[str]:
    """What breaks the rule in `files` (number -> SQL), for the files from FIRST_CHECKED on."""
    problems: list[str] = []
    validated_later: dict[int, set[str]] = {}
    later: set[str] = set()
    for number in sorted(files, reverse=True):
        validated_later[number] = set(later)
        later |= {m.lower().strip('"') for m in _VALIDATE.findall(_strip_comments(files[number]))}
    created: set[str] = set()
    for number in sorted(files):
        sql = _strip_comments(files[number])
        created |= {m.lower().strip('"') for m in _CREATED.findall(sql)}
        if number < FIRST_CHECKED:
            continue
        new_here = {m.lower().strip('"') for m in _CREATED.findall(sql)}
        for stmt in _STATEMENTS.split(sql):
            alter = _ALTER.search(stmt)
            if alter is None or alter.group(1).lower().strip('"') in new_here:
                continue  # a table made in this very file is empty: nothing to scan
            table = alter.group(1)
            for name, kind in _ADD_CONSTRAINT.findall(stmt):
                if not re.search(r"\bNOT\s+VALID\b", stmt, re.I):
                    problems.append(f"{number:04d}: {kind.upper()} {name} on {table} without NOT VALID "
                                    "(it scans the table under an exclusive lock)")
                elif name.lower().strip('"') not in validated_later[number]:
                    problems.append(f"{number:04d}: {name} on {table} is NOT VALID and no later file "
                                    "validates it (VALIDATE CONSTRAINT, in a file of its own)")
            if _ADD_COLUMN_CHECKED.search(stmt):
                problems.append(f"{number:04d}: a column added to {table} with REFERENCES or CHECK "
                                "(add the column, then the constraint NOT VALID)")
            for column in _SET_NOT_NULL.findall(stmt):
                problems.append(f"{number:04d}: {table}.{column} SET NOT NULL scans the table: validate a "
                                f"CHECK ({column} IS NOT NULL) in an earlier file first")
    return [p for p in problems if not _trusted_not_null(p, files)]


def _trusted_not_null(problem: str, files: dict[int, str]) -> bool:
    """SET NOT NULL after a validated CHECK (c IS NOT NULL) in an earlier file is fine."""
    m = re.search(r"^(\d{4}): ([\w.\"]+)\.([\w\"]+) SET NOT NULL", problem)
    if m is None:
        return False
    number, column = int(m.group(1)), m.group(3)
    earlier = " ".join(_strip_comments(files[n]) for n in files if n < number)
    return re.search(rf"CHECK\s*\(\s*{re.escape(column)}\s+IS\s+NOT\s+NULL\s*\)", earlier, re.I) is not None
